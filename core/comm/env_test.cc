#include "core/comm/env.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

absl::StatusOr<DistEnv> Parse(const std::map<std::string, std::string>& vars) {
  return DistEnvFromLookup([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(EnvTest, Torchrun) {
  DistEnv env = Parse({{"RANK", "5"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "1"},
                       {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_ADDR", "node0"},
                       {"MASTER_PORT", "29500"}})
                    .value();
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(EnvTest, Slurm) {
  DistEnv env = Parse({{"SLURM_PROCID", "3"},
                       {"SLURM_NTASKS", "4"},
                       {"SLURM_LOCALID", "1"},
                       {"SLURM_TASKS_PER_NODE", "2(x2)"},
                       {"SLURM_JOB_NODELIST", "gpu7"},
                       {"MASTER_PORT", "1234"}})
                    .value();
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "gpu7");
}

TEST(EnvTest, OpenMpi) {
  DistEnv env = Parse({{"OMPI_COMM_WORLD_RANK", "2"},
                       {"OMPI_COMM_WORLD_SIZE", "3"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                       {"MASTER_ADDR", "10.0.0.1"},
                       {"MASTER_PORT", "4000"}})
                    .value();
  EXPECT_EQ(env.source, "openmpi");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
}

TEST(EnvTest, NothingSetListsTheVariables) {
  absl::StatusOr<DistEnv> env = Parse({});
  ASSERT_FALSE(env.ok());
  for (const char* var :
       {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
        "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}) {
    EXPECT_NE(env.status().message().find(var), std::string::npos) << var;
  }
}

TEST(EnvTest, JobIdFromTheLauncherOrSlurm) {
  const std::map<std::string, std::string> torchrun = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}};
  EXPECT_EQ(Parse(torchrun).value().job_id, "");
  std::map<std::string, std::string> vars = torchrun;
  vars["MCC_JOB_ID"] = "abc";
  vars["SLURM_JOB_ID"] = "77";
  EXPECT_EQ(Parse(vars).value().job_id, "abc");
  // A launcher inside an allocation: its ranks are not the allocation's.
  vars.erase("MCC_JOB_ID");
  EXPECT_EQ(Parse(vars).value().job_id, "");
  const std::map<std::string, std::string> srun = {
      {"SLURM_PROCID", "3"},  {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "77"},
      {"SLURM_STEP_ID", "2"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "1"}};
  EXPECT_EQ(Parse(srun).value().job_id, "slurm-77.2");
}

TEST(EnvTest, SecretFromTheEnvironmentOrAFile) {
  std::map<std::string, std::string> vars = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}};
  EXPECT_EQ(Parse(vars).value().secret, "") << "no secret: unauthenticated";
  const std::string dir =
      std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string path = dir + "/secret";
  std::ofstream(path) << "from file\n";
  vars["MCC_JOB_SECRET_FILE"] = path;
  EXPECT_EQ(Parse(vars).value().secret, "from file");
  vars["MCC_JOB_SECRET"] = "direct";
  EXPECT_EQ(Parse(vars).value().secret, "direct");
  vars.erase("MCC_JOB_SECRET");
  vars["MCC_JOB_SECRET_FILE"] = dir + "/no such file";
  absl::StatusOr<DistEnv> missing = Parse(vars);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no such file"), std::string::npos)
      << missing.status();
  std::ofstream(path) << " \n";
  vars["MCC_JOB_SECRET_FILE"] = path;
  absl::StatusOr<DistEnv> empty = Parse(vars);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("is empty"), std::string::npos)
      << empty.status();
}

TEST(EnvTest, RandomJobIdsDiffer) {
  const std::string a = RandomJobId(), b = RandomJobId();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_NE(a, b);
}

TEST(EnvTest, BadValuesAreNamed) {
  absl::StatusOr<DistEnv> env =
      Parse({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
  EXPECT_NE(env.status().message().find("RANK='x'"), std::string::npos);
  env = Parse({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
  EXPECT_NE(env.status().message().find("rank 2 with world size 2"),
            std::string::npos);
  env = Parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_NE(env.status().message().find("MASTER_PORT is not set"),
            std::string::npos);
}

}  // namespace
}  // namespace comm
}  // namespace mcc
