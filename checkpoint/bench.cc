// Checkpoint save/load throughput beside a raw sequential write/read of the
// same bytes, in the same run and directory.
//
//   tools/bazel run //checkpoint:bench -- --bytes_mb=256 --dir=/tmp
//
// "cold" reads drop the files from the page cache first
// (posix_fadvise(DONTNEED) after fsync); "warm" reads come from it.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/async_saver.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/file_util.h"
#include "core/crc32c.h"
#include "core/status_macros.h"

ABSL_FLAG(int64_t, bytes_mb, 256, "Checkpoint size in MiB.");
ABSL_FLAG(int32_t, tensors, 16, "Number of tensors (equal sizes).");
ABSL_FLAG(int32_t, reps, 3, "Repetitions (best time reported).");
ABSL_FLAG(std::string, dir, "", "Scratch directory (default $TMPDIR or /tmp).");

namespace mcc {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void DropFileCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void DropCache(const std::string& root) {
  if (std::filesystem::is_regular_file(root)) return DropFileCache(root);
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) DropFileCache(e.path().string());
  }
}

void Report(const char* what, double bytes, double seconds) {
  std::printf("%-44s %8.3f s %8.2f GB/s\n", what, seconds,
              bytes / seconds / 1e9);
}

int Main() {
  const int64_t total = absl::GetFlag(FLAGS_bytes_mb) << 20;
  const int n = absl::GetFlag(FLAGS_tensors);
  std::string base = absl::GetFlag(FLAGS_dir);
  if (base.empty())
    base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  const std::string root = file_util::JoinPath(base, "mcc_checkpoint_bench");
  MCC_CHECK_OK(file_util::RemoveAll(root));
  MCC_CHECK_OK(file_util::MakeDirs(root));

  const int64_t per = total / n / 4;  // fp32 elements per tensor
  std::vector<ShardedTensorRef> refs;
  for (int i = 0; i < n; ++i) {
    Tensor t = Tensor::Empty({per / 1024, 1024}, DType::kFloat32);
    float* p = t.data<float>();
    for (int64_t k = 0; k < t.numel(); ++k)
      p[k] = static_cast<float>((k * 2654435761u + i) & 0xFFFF);
    refs.push_back(
        ShardedTensorRef::Replicated(absl::StrCat("layer", i, ".weight"), t));
  }
  const double bytes = static_cast<double>(n) * refs[0].local.nbytes();
  std::printf("checkpoint bench: %d fp32 tensors, %.1f MiB, in %s\n", n,
              bytes / (1 << 20), root.c_str());

  // CRC32C alone.
  {
    const Tensor& t = refs[0].local;
    double t0 = Now();
    uint32_t c = crc32c_internal::ExtendHardware(0, t.raw_data(), t.nbytes());
    Report("crc32c sse4.2", t.nbytes(), Now() - t0);
    t0 = Now();
    c ^= crc32c_internal::ExtendPortable(0, t.raw_data(), t.nbytes());
    Report("crc32c slice-by-8", t.nbytes(), Now() - t0);
    if (c != 0) std::printf("(crc mismatch!)\n");
  }

  // Raw sequential write + fsync and read, then the checkpoint's, alternated
  // `reps` times; the best time of each is reported (the disk is shared).
  const int reps = absl::GetFlag(FLAGS_reps);
  const std::string raw = file_util::JoinPath(root, "raw.bin");
  const std::string dir = file_util::JoinPath(root, "ckpt");
  const DistContext dist = DistContext::Single();
  std::vector<char> buf(refs[0].local.nbytes());
  auto raw_read = [&] {
    const int fd = ::open(raw.c_str(), O_RDONLY);
    ssize_t r;
    while ((r = ::read(fd, buf.data(), buf.size())) > 0) {
    }
    ::close(fd);
  };
  auto ckpt_load = [&] {
    auto reader = CheckpointReader::Open(dir);
    MCC_CHECK_OK(reader.status());
    MCC_CHECK_OK((*reader)->Load(refs));
  };
  double best[8];
  std::fill(best, best + 8, 1e30);
  auto timed = [&](int slot, const std::function<void()>& fn) {
    const double t0 = Now();
    fn();
    best[slot] = std::min(best[slot], Now() - t0);
  };
  for (int rep = 0; rep < reps; ++rep) {
    timed(0, [&] {
      auto f = file_util::WritableFile::Create(raw);
      MCC_CHECK_OK(f.status());
      for (const auto& r : refs) {
        MCC_CHECK_OK(f->Append(r.local.raw_data(), r.local.nbytes()));
      }
      MCC_CHECK_OK(f->Close());
    });
    MCC_CHECK_OK(file_util::RemoveAll(dir));  // Not a replacing save.
    timed(1, [&] { MCC_CHECK_OK(SaveCheckpoint(dir, 1, refs, {}, {}, dist)); });
    timed(2, raw_read);
    timed(3, ckpt_load);
    DropCache(raw);
    DropCache(dir);
    timed(4, raw_read);
    timed(5, ckpt_load);
    // Resharded: every tensor read as 4 column blocks (a dim-1 split).
    timed(6, [&] {
      auto reader = CheckpointReader::Open(dir);
      MCC_CHECK_OK(reader.status());
      for (const auto& r : refs) {
        for (int j = 0; j < 4; ++j) {
          Tensor part = Tensor::Empty({r.local.size(0), 256}, DType::kFloat32);
          MCC_CHECK_OK((*reader)->ReadRegion(r.name, {0, 256 * j}, &part));
        }
      }
    });
    MCC_CHECK_OK(file_util::RemoveAll(raw));
  }
  Report("raw write + fsync", bytes, best[0]);
  Report("checkpoint save (sync, fsync'd, CRC32C)", bytes, best[1]);
  Report("raw read (warm page cache)", bytes, best[2]);
  Report("checkpoint load (warm, CRC32C verified)", bytes, best[3]);
  Report("raw read (cold: fadvise DONTNEED)", bytes, best[4]);
  Report("checkpoint load (cold, CRC32C verified)", bytes, best[5]);
  Report("checkpoint load as 4 column blocks (warm)", bytes, best[6]);

  {
    AsyncCheckpointSaver saver;
    for (int it = 2; it <= 3; ++it) {
      const double t0 = Now();
      MCC_CHECK_OK(saver.Start(dir, it, refs, {}, {}, dist));
      const double blocked = Now() - t0;
      MCC_CHECK_OK(saver.Wait());
      const double total_s = Now() - t0;
      Report(it == 2 ? "async save 1: training blocked (alloc+copy)"
                     : "async save 2: training blocked (copy)",
             bytes, blocked);
      Report(it == 2 ? "async save 1: until committed"
                     : "async save 2: until committed",
             bytes, total_s);
    }
  }
  MCC_CHECK_OK(file_util::RemoveAll(root));
  return 0;
}

}  // namespace
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mcc::Main();
}
