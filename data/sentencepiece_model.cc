#include "data/sentencepiece_model.h"

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "data/sentencepiece_shim.h"

#if defined(__SANITIZE_ADDRESS__)
#define MCC_SENTENCEPIECE_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MCC_SENTENCEPIECE_UNDER_ASAN 1
#endif
#endif

namespace mcc::data {
namespace {

constexpr char kShimName[] = "libmcc_sentencepiece_shim.so";
constexpr char kShimRunfile[] = "data/libmcc_sentencepiece_shim.so";

bool Exists(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

// The shim in a runfiles tree: under any workspace directory (this
// repository is "megatron_cpp" here, another name when a workspace depends
// on it).
std::string FindInRunfiles(const std::string& root) {
  if (root.empty()) return "";
  DIR* d = opendir(root.c_str());
  if (d == nullptr) return "";
  std::string found;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    for (const std::string& p :
         {root + "/" + name + "/" + kShimRunfile,
          root + "/" + name + "/external/" + name + "/" + kShimRunfile}) {
      if (found.empty() && Exists(p)) found = p;
    }
  }
  closedir(d);
  return found;
}

std::string FindShim() {
  if (const char* env = std::getenv("MCC_SENTENCEPIECE_SHIM")) return env;
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* dir = std::getenv(var)) {
      const std::string p = FindInRunfiles(dir);
      if (!p.empty()) return p;
    }
  }
  const std::string exe = SelfExe();
  if (!exe.empty()) {
    const std::string p = FindInRunfiles(exe + ".runfiles");
    if (!p.empty()) return p;
    const std::string beside = exe.substr(0, exe.rfind('/') + 1) + kShimName;
    if (Exists(beside)) return beside;
  }
  return "";
}

// dlopens the shim once per process.
MccSentencePieceShimLoad ShimLoader(std::string* error) {
  static std::once_flag once;
  static MccSentencePieceShimLoad load = nullptr;
  static std::string load_error;
  std::call_once(once, [] {
#ifdef MCC_SENTENCEPIECE_UNDER_ASAN
    load_error =
        "not in an AddressSanitizer build: the library must be loaded with "
        "RTLD_DEEPBIND (see sentencepiece_shim.h), which the sanitizer "
        "runtime refuses";
    return;
#endif
    const std::string path = FindShim();
    if (path.empty()) {
      load_error = std::string("cannot find ") + kShimName +
                   " (set MCC_SENTENCEPIECE_SHIM, or keep it in the binary's "
                   "runfiles or beside the binary)";
      return;
    }
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == nullptr) {
      load_error = std::string("dlopen ") + path + ": " + dlerror();
      return;
    }
    load = reinterpret_cast<MccSentencePieceShimLoad>(
        dlsym(h, "mcc_sentencepiece_shim_load"));
    if (load == nullptr) {
      load_error = path + ": no mcc_sentencepiece_shim_load";
    }
  });
  if (load == nullptr) *error = load_error;
  return load;
}

}  // namespace

bool SentencePieceModel::Available(std::string* why) {
  return ShimLoader(why) != nullptr;
}

struct SentencePieceModel::Impl {
  std::unique_ptr<SentencePieceShim> shim;
};

SentencePieceModel::SentencePieceModel(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::LoadShim(
    const std::string& path_or_bytes, bool from_serialized,
    const std::string& label, std::string* error) {
  std::string why;
  MccSentencePieceShimLoad load = ShimLoader(&why);
  if (load == nullptr) {
    *error = label + ": SentencePiece is not available: " + why;
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->shim.reset(load(&path_or_bytes, from_serialized, &why));
  if (impl->shim == nullptr) {
    *error = label + ": " + why;
    return nullptr;
  }
  return std::unique_ptr<SentencePieceModel>(
      new SentencePieceModel(std::move(impl)));
}

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(
    const std::string& path, std::string* error) {
  return LoadShim(path, false, path, error);
}

std::unique_ptr<SentencePieceModel> SentencePieceModel::LoadFromSerialized(
    std::string_view serialized, const std::string& label, std::string* error) {
  return LoadShim(std::string(serialized), true, label, error);
}

int SentencePieceModel::piece_size() const { return impl_->shim->piece_size(); }
int SentencePieceModel::eos_id() const { return impl_->shim->eos_id(); }
int SentencePieceModel::bos_id() const { return impl_->shim->bos_id(); }

bool SentencePieceModel::Encode(std::string_view text, std::vector<int>* ids,
                                std::string* error) const {
  return impl_->shim->Encode(text, ids, error);
}

bool SentencePieceModel::Decode(const std::vector<int>& ids, std::string* text,
                                std::string* error) const {
  return impl_->shim->Decode(ids, text, error);
}

}  // namespace mcc::data
