#ifndef CORE_COMM_ENV_H_
#define CORE_COMM_ENV_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace mcc {
namespace comm {

// Where this process sits in the job, as the launcher described it.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string source;  // "torchrun", "slurm", "openmpi"
  // Which job the ranks belong to: rank 0's store refuses ranks of another
  // job (two jobs given one port). From MCC_JOB_ID (tools/launch sets it),
  // else SLURM's job and step ids; "" when neither is set.
  std::string job_id;
  // The job's shared secret, which rank 0's store requires every connection
  // to prove (a challenge-response in its hello): MCC_JOB_SECRET, else the
  // content of the file MCC_JOB_SECRET_FILE names (trailing whitespace
  // dropped). "" when neither is set: the store is then unauthenticated,
  // as for a job started by hand with plain RANK/WORLD_SIZE/MASTER_* or by
  // srun without these variables.
  std::string secret;
};

inline constexpr char kJobIdEnv[] = "MCC_JOB_ID";
// A fresh job id (16 random hex digits) for a launcher to set in kJobIdEnv.
std::string RandomJobId();

inline constexpr char kJobSecretEnv[] = "MCC_JOB_SECRET";
inline constexpr char kJobSecretFileEnv[] = "MCC_JOB_SECRET_FILE";
// The secret in a file (every node of a job reads the same one): its content
// without trailing whitespace. An unreadable or empty file is an error
// naming it.
absl::StatusOr<std::string> ReadJobSecretFile(const std::string& path);

// Reads the environment, trying in order:
//  torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//            MASTER_PORT;
//  SLURM:    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//            SLURM_NTASKS_PER_NODE (or SLURM_TASKS_PER_NODE);
//  Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//            OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE.
// For SLURM and Open MPI the store address still comes from MASTER_ADDR and
// MASTER_PORT (SLURM: MASTER_ADDR defaults to the first host of
// SLURM_JOB_NODELIST when it is a plain name). The error lists every
// variable looked for.
absl::StatusOr<DistEnv> DistEnvFromEnvironment();
// The same with a custom lookup (nullptr for an unset variable), for tests.
absl::StatusOr<DistEnv> DistEnvFromLookup(
    const std::function<const char*(const char*)>& getenv_fn);

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_ENV_H_
