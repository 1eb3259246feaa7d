#include "core/comm/env.h"

#include <errno.h>
#include <string.h>

#include <cstdlib>
#include <fstream>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace mcc {
namespace comm {
namespace {

using Lookup = std::function<const char*(const char*)>;

// Reads an integer variable; absent leaves *out unchanged and returns false.
absl::StatusOr<bool> ReadInt(const Lookup& getenv_fn, const char* name,
                             int* out) {
  const char* v = getenv_fn(name);
  if (v == nullptr || *v == '\0') return false;
  int value = 0;
  if (!absl::SimpleAtoi(v, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable ", name, "='", v, "' is not an integer"));
  }
  *out = value;
  return true;
}

absl::Status Validate(const DistEnv& env) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", env.source, " environment: rank ", env.rank,
                     " with world size ", env.world_size));
  }
  if (env.local_world_size < 1 || env.local_rank < 0 ||
      env.local_rank >= env.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad ", env.source, " environment: local rank ", env.local_rank,
        " with local world size ", env.local_world_size));
  }
  if (env.master_port < 0 || env.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT=", env.master_port, " is out of range"));
  }
  return absl::OkStatus();
}

absl::Status ReadMaster(const Lookup& getenv_fn, DistEnv* env,
                        bool port_required) {
  if (const char* addr = getenv_fn("MASTER_ADDR"); addr && *addr) {
    env->master_addr = addr;
  }
  absl::StatusOr<bool> has_port =
      ReadInt(getenv_fn, "MASTER_PORT", &env->master_port);
  if (!has_port.ok()) return has_port.status();
  if (!*has_port && port_required) {
    return absl::InvalidArgumentError(absl::StrCat(
        env->source, " environment found (rank ", env->rank, " of ",
        env->world_size,
        ") but MASTER_PORT is not set: set MASTER_ADDR and MASTER_PORT to "
        "rank 0's host and a free port"));
  }
  return absl::OkStatus();
}

// The ranks' places, from the first launcher's variables found.
absl::StatusOr<DistEnv> ReadPlaces(const Lookup& getenv_fn) {
  DistEnv env;
  // torchrun (and tools/launch).
  {
    int rank = 0, world = 0;
    absl::StatusOr<bool> has_rank = ReadInt(getenv_fn, "RANK", &rank);
    if (!has_rank.ok()) return has_rank.status();
    absl::StatusOr<bool> has_world = ReadInt(getenv_fn, "WORLD_SIZE", &world);
    if (!has_world.ok()) return has_world.status();
    if (*has_rank && *has_world) {
      env.source = "torchrun";
      env.rank = rank;
      env.world_size = world;
      env.local_rank = rank;
      env.local_world_size = world;
      absl::StatusOr<bool> b =
          ReadInt(getenv_fn, "LOCAL_RANK", &env.local_rank);
      if (!b.ok()) return b.status();
      b = ReadInt(getenv_fn, "LOCAL_WORLD_SIZE", &env.local_world_size);
      if (!b.ok()) return b.status();
      if (absl::Status s = ReadMaster(getenv_fn, &env, world > 1); !s.ok()) {
        return s;
      }
      if (absl::Status s = Validate(env); !s.ok()) return s;
      return env;
    }
  }
  // SLURM (srun).
  {
    int rank = 0, world = 0;
    absl::StatusOr<bool> has_rank = ReadInt(getenv_fn, "SLURM_PROCID", &rank);
    if (!has_rank.ok()) return has_rank.status();
    absl::StatusOr<bool> has_world = ReadInt(getenv_fn, "SLURM_NTASKS", &world);
    if (!has_world.ok()) return has_world.status();
    if (*has_rank && *has_world) {
      env.source = "slurm";
      env.rank = rank;
      env.world_size = world;
      env.local_rank = 0;
      absl::StatusOr<bool> b =
          ReadInt(getenv_fn, "SLURM_LOCALID", &env.local_rank);
      if (!b.ok()) return b.status();
      env.local_world_size = std::max(1, env.local_rank + 1);
      b = ReadInt(getenv_fn, "SLURM_NTASKS_PER_NODE", &env.local_world_size);
      if (!b.ok()) return b.status();
      if (!*b) {
        // SLURM_TASKS_PER_NODE looks like "4(x2),3": take the first count.
        if (const char* tpn = getenv_fn("SLURM_TASKS_PER_NODE"); tpn) {
          int v = 0;
          std::string first =
              std::string(tpn).substr(0, std::string(tpn).find_first_of("(,"));
          if (absl::SimpleAtoi(first, &v)) env.local_world_size = v;
        }
      }
      if (const char* nodes = getenv_fn("SLURM_JOB_NODELIST");
          nodes && getenv_fn("MASTER_ADDR") == nullptr) {
        std::string n = nodes;
        if (n.find_first_of("[,") == std::string::npos) env.master_addr = n;
      }
      if (absl::Status s = ReadMaster(getenv_fn, &env, world > 1); !s.ok()) {
        return s;
      }
      if (absl::Status s = Validate(env); !s.ok()) return s;
      return env;
    }
  }
  // Open MPI (mpirun).
  {
    int rank = 0, world = 0;
    absl::StatusOr<bool> has_rank =
        ReadInt(getenv_fn, "OMPI_COMM_WORLD_RANK", &rank);
    if (!has_rank.ok()) return has_rank.status();
    absl::StatusOr<bool> has_world =
        ReadInt(getenv_fn, "OMPI_COMM_WORLD_SIZE", &world);
    if (!has_world.ok()) return has_world.status();
    if (*has_rank && *has_world) {
      env.source = "openmpi";
      env.rank = rank;
      env.world_size = world;
      env.local_rank = 0;
      env.local_world_size = 1;
      absl::StatusOr<bool> b =
          ReadInt(getenv_fn, "OMPI_COMM_WORLD_LOCAL_RANK", &env.local_rank);
      if (!b.ok()) return b.status();
      b = ReadInt(getenv_fn, "OMPI_COMM_WORLD_LOCAL_SIZE",
                  &env.local_world_size);
      if (!b.ok()) return b.status();
      if (absl::Status s = ReadMaster(getenv_fn, &env, world > 1); !s.ok()) {
        return s;
      }
      if (absl::Status s = Validate(env); !s.ok()) return s;
      return env;
    }
  }
  return absl::NotFoundError(
      "no distributed environment found: looked for torchrun's RANK and "
      "WORLD_SIZE (with LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, "
      "MASTER_PORT), SLURM's SLURM_PROCID and SLURM_NTASKS (with "
      "SLURM_LOCALID, SLURM_NTASKS_PER_NODE), and Open MPI's "
      "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (with "
      "OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE); start the "
      "program with tools/launch, torchrun, srun or mpirun");
}

}  // namespace

absl::StatusOr<std::string> ReadJobSecretFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string secret;
  if (in) {
    // Far more than a secret needs; a wrong path to a large file stops here.
    secret.resize(64 << 10);
    in.read(&secret[0], static_cast<std::streamsize>(secret.size()));
    secret.resize(static_cast<size_t>(in.gcount()));
  }
  if (!in && !in.eof()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the job secret file '", path,
                     "' (MCC_JOB_SECRET_FILE, tools/launch "
                     "--rdzv-secret-file): ",
                     strerror(errno)));
  }
  while (!secret.empty() && absl::ascii_isspace(secret.back())) {
    secret.pop_back();
  }
  if (secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job secret file '", path,
        "' is empty: write a random secret into it, e.g. openssl rand -hex "
        "32 > FILE"));
  }
  return secret;
}

absl::StatusOr<DistEnv> DistEnvFromLookup(const Lookup& getenv_fn) {
  absl::StatusOr<DistEnv> env = ReadPlaces(getenv_fn);
  if (!env.ok()) return env;
  if (const char* secret = getenv_fn(kJobSecretEnv);
      secret != nullptr && *secret != '\0') {
    env->secret = secret;
  } else if (const char* file = getenv_fn(kJobSecretFileEnv);
             file != nullptr && *file != '\0') {
    absl::StatusOr<std::string> from_file = ReadJobSecretFile(file);
    if (!from_file.ok()) return from_file.status();
    env->secret = *std::move(from_file);
  }
  if (const char* id = getenv_fn(kJobIdEnv); id != nullptr) {
    env->job_id = id;
  } else if (const char* slurm_job = getenv_fn("SLURM_JOB_ID");
             slurm_job != nullptr && env->source == "slurm") {
    // One srun: its step, within the allocation.
    const char* step = getenv_fn("SLURM_STEP_ID");
    env->job_id =
        absl::StrCat("slurm-", slurm_job, step ? "." : "", step ? step : "");
  }
  return env;
}

std::string RandomJobId() {
  std::random_device random;
  return absl::StrFormat("%08x%08x", random(), random());
}

absl::StatusOr<DistEnv> DistEnvFromEnvironment() {
  return DistEnvFromLookup([](const char* name) { return std::getenv(name); });
}

}  // namespace comm
}  // namespace mcc
