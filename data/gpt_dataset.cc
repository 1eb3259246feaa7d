#include "data/gpt_dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/progress_meter.h"
#include "data/npy.h"
#include "glog/logging.h"

namespace mcc::data {

const char* SplitName(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kValid:
      return "valid";
    case Split::kTest:
      return "test";
  }
  return "?";
}

std::string HashHex(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return absl::StrFormat("%016x", h);
}

int NumEpochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples,
              int32_t sequence_length) {
  if (!num_samples.has_value()) return 1;
  CHECK_GT(tokens_per_epoch, 0);
  const int64_t requested = *num_samples * sequence_length + 1;
  int epochs = 1;
  int64_t tokens = tokens_per_epoch;
  while (tokens < requested) {
    ++epochs;
    tokens += tokens_per_epoch;
  }
  return epochs;
}

std::vector<int32_t> BuildDocumentIndex(absl::Span<const int32_t> documents,
                                        int num_epochs, NumpyRandomState& rng,
                                        bool separate_final_epoch) {
  if (!separate_final_epoch || num_epochs == 1) {
    std::vector<int32_t> index;
    index.reserve(documents.size() * num_epochs);
    for (int e = 0; e < num_epochs; ++e) {
      index.insert(index.end(), documents.begin(), documents.end());
    }
    rng.Shuffle(index.data(), index.size());
    return index;
  }
  std::vector<int32_t> first =
      BuildDocumentIndex(documents, num_epochs - 1, rng, false);
  std::vector<int32_t> last = BuildDocumentIndex(documents, 1, rng, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

std::vector<int64_t> BuildSampleIndex(absl::Span<const int32_t> sizes,
                                      absl::Span<const int32_t> document_index,
                                      int32_t sequence_length, int num_epochs,
                                      int64_t tokens_per_epoch,
                                      bool drop_last_partial_sequence,
                                      const IndexBuildProgress& progress) {
  constexpr int kExtra = 1;
  CHECK_GT(sequence_length, 1);
  CHECK_GT(num_epochs, 0);
  CHECK_GT(tokens_per_epoch, 1);
  const int64_t total = num_epochs * tokens_per_epoch - kExtra;
  // Megatron computes the partial count in float32: ceil(float(total) / seq).
  const int64_t num_samples =
      drop_last_partial_sequence
          ? total / sequence_length
          : static_cast<int64_t>(
                std::ceil(static_cast<float>(total) / sequence_length));
  std::vector<int64_t> index;
  index.reserve(2 * (num_samples + 1));
  int64_t doc = 0;     // position in document_index
  int64_t offset = 0;  // token offset in that document
  index.push_back(doc);
  index.push_back(offset);
  const int64_t last_doc = static_cast<int64_t>(document_index.size()) - 1;
  for (int64_t s = 1; s <= num_samples; ++s) {
    int64_t remaining = sequence_length + kExtra;
    while (remaining != 0) {
      const int64_t length = sizes[document_index[doc]] - offset;
      remaining -= length;
      if (remaining <= 0) {
        // The sample ends inside this document; its extra token is the next
        // sample's first.
        offset += remaining + length - kExtra;
        remaining = 0;
      } else if (doc == last_doc) {
        // Out of documents (only for a kept partial sample).
        offset = sizes[document_index[doc]] - kExtra;
        break;
      } else {
        ++doc;
        offset = 0;
      }
    }
    index.push_back(doc);
    index.push_back(offset);
    if (progress && s % kIndexProgressEvery == 0) progress(s, num_samples);
  }
  if (progress) progress(num_samples, num_samples);
  return index;
}

std::vector<int64_t> BuildShuffleIndex(int64_t num_samples, int64_t total_size,
                                       NumpyRandomState& rng) {
  std::vector<int64_t> index(total_size);
  std::iota(index.begin(), index.end(), 0);
  rng.Shuffle(index.data(), num_samples);
  if (num_samples < total_size) {
    rng.Shuffle(index.data() + num_samples, total_size - num_samples);
  }
  return index;
}

GPTIndices BuildGPTIndices(absl::Span<const int32_t> sizes, int64_t begin,
                           int64_t end, std::optional<int64_t> num_samples,
                           Split split, const GPTDatasetConfig& config) {
  const int32_t seq = config.sequence_length;
  std::vector<int32_t> documents(end - begin);
  std::iota(documents.begin(), documents.end(), static_cast<int32_t>(begin));
  int64_t tokens_per_epoch = 0;
  for (int64_t i = begin; i < end; ++i) tokens_per_epoch += sizes[i];
  GPTIndices out;
  out.num_epochs = NumEpochs(tokens_per_epoch, num_samples, seq);
  int64_t samples_sans_final = 0;
  if (out.num_epochs > 1) {
    samples_sans_final = ((out.num_epochs - 1) * tokens_per_epoch - 1) / seq;
    const int64_t from_final = *num_samples - samples_sans_final;
    const int64_t per_epoch = (tokens_per_epoch - 1) / seq;
    CHECK_GE(from_final, 0);
    CHECK_LE(from_final, per_epoch + 1);
    out.separate_final_epoch =
        from_final <
        static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  NumpyRandomState rng(config.random_seed);
  out.document_index = BuildDocumentIndex(documents, out.num_epochs, rng,
                                          out.separate_final_epoch);
  const bool drop_last = split == Split::kValid
                             ? config.drop_last_partial_validation_sequence
                             : true;
  // A progress line for big builds on a terminal; off one, Build's own
  // summary line is the report.
  std::unique_ptr<ProgressMeter> meter;
  IndexBuildProgress progress;
  if (ProgressMeter::IsTerminal(stderr) &&
      out.num_epochs * tokens_per_epoch / seq >= kIndexProgressFrom) {
    progress = [&](int64_t done, int64_t total) {
      if (meter == nullptr) {
        ProgressMeter::Options o;
        o.label = absl::StrCat("GPT sample index (", SplitName(split), ")");
        o.unit = "samples";
        o.total_items = total;
        o.terminal = true;
        meter = std::make_unique<ProgressMeter>(std::move(o));
      }
      if (done < total) {
        meter->Update(done);
      } else {
        meter->Finish(done);
      }
    };
  }
  out.sample_index =
      BuildSampleIndex(sizes, out.document_index, seq, out.num_epochs,
                       tokens_per_epoch, drop_last, progress);
  const int64_t total = static_cast<int64_t>(out.sample_index.size() / 2) - 1;
  out.shuffle_index = BuildShuffleIndex(
      out.separate_final_epoch ? samples_sans_final : total, total, rng);
  return out;
}

// ----------------------------------------------------------------- GPTDataset

namespace {

bool FileExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

// Checks that every sample GetSample can be asked for reads inside its
// documents and yields at most `want` tokens, walking the sample index as
// GetSample does. Document positions (already checked to lie in the document
// index) must not decrease, which also bounds the walk by the index sizes.
absl::Status CheckSampleBounds(const GPTIndices& ix,
                               absl::Span<const int32_t> lengths, int64_t want,
                               const std::string& sample_path) {
  const int64_t n_pairs = ix.sample_index.size() / 2;
  const int64_t* pairs = ix.sample_index.data();
  auto bad = [&](int64_t i, absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat(sample_path, ": sample ", i, " ", what));
  };
  for (int64_t i = 0; i + 1 < n_pairs; ++i) {
    const int64_t doc_beg = pairs[2 * i], off_beg = pairs[2 * i + 1];
    const int64_t doc_end = pairs[2 * i + 2], off_end = pairs[2 * i + 3];
    if (doc_end < doc_beg) return bad(i, "ends before it starts");
    const int64_t len_beg = lengths[ix.document_index[doc_beg]];
    const int64_t len_end = lengths[ix.document_index[doc_end]];
    if (off_beg < 0 || off_beg > len_beg) {
      return bad(i, absl::StrCat("starts at token ", off_beg,
                                 " of a document of ", len_beg));
    }
    if (off_end < -1 || off_end > len_end) {
      return bad(i, absl::StrCat("ends at token ", off_end,
                                 " of a document of ", len_end));
    }
    int64_t n = 0;
    for (int64_t d = doc_beg; d <= doc_end && n <= want; ++d) {
      const int64_t len = lengths[ix.document_index[d]];
      const int64_t off = d == doc_beg ? off_beg : 0;
      const int64_t take = std::min<int64_t>(
          d < doc_end ? len - off : off_end - off + 1, len - off);
      if (take < 0) return bad(i, "has a negative length");
      n += take;
    }
    if (n > want) {
      return bad(i, absl::StrCat("holds more than ", want, " tokens"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GPTDataset>> GPTDataset::Build(
    std::shared_ptr<const IndexedDataset> dataset, int64_t begin, int64_t end,
    std::optional<int64_t> num_samples, Split split,
    const GPTDatasetConfig& config, const RankSync& sync) {
  const std::string& prefix = dataset->prefix();
  if (begin < 0 || end > dataset->num_sequences() || begin >= end) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": ", SplitName(split), " split has sequences [", begin, ", ",
        end, ") of ", dataset->num_sequences(), "; it must not be empty"));
  }
  if (config.sequence_length < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--seq-length must be at least 2, got ", config.sequence_length));
  }
  int64_t tokens = 0;
  for (int64_t i = begin; i < end; ++i)
    tokens += dataset->sequence_lengths()[i];
  if (tokens < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": ", SplitName(split), " split [", begin, ", ", end,
        ") holds ", tokens, " tokens, too few for one sample"));
  }

  std::unique_ptr<GPTDataset> ds(new GPTDataset());
  ds->dataset_ = dataset;
  ds->config_ = config;
  const bool drop_last = split == Split::kValid
                             ? config.drop_last_partial_validation_sequence
                             : true;
  ds->description_ = absl::StrCat(
      "{\"class\": \"GPTDataset\", \"dataset_path\": \"", prefix,
      "\", \"index_split\": \"", SplitName(split), "\", \"indices\": [", begin,
      ", ", end,
      "], \"num_samples\": ", num_samples ? absl::StrCat(*num_samples) : "null",
      ", \"sequence_length\": ", config.sequence_length,
      ", \"random_seed\": ", config.random_seed,
      ", \"add_extra_token_to_sequence\": true, \"drop_last_partial\": ",
      drop_last ? "true" : "false",
      ", \"num_sequences\": ", dataset->num_sequences(),
      ", \"num_tokens\": ", dataset->num_tokens(), "}");
  ds->hash_ = HashHex(ds->description_);

  if (config.path_to_cache == "-") {
    const absl::Time t0 = absl::Now();
    ds->indices_ = BuildGPTIndices(dataset->sequence_lengths(), begin, end,
                                   num_samples, split, config);
    ds->built_anew_ = true;
    VLOG(1) << "built " << SplitName(split) << " indices in "
            << absl::Now() - t0;
    return ds;
  }

  std::string dir = config.path_to_cache;
  if (dir.empty()) {
    dir = (std::filesystem::path(prefix).parent_path() / "cache" /
           "GPTDataset_indices")
              .string();
  }
  ds->cache_prefix_ =
      (std::filesystem::path(dir) /
       absl::StrCat(ds->hash_, "-GPTDataset-", SplitName(split)))
          .string();
  const std::string desc_path = ds->cache_prefix_ + "-description.txt";
  const std::string doc_path = ds->cache_prefix_ + "-document_index.npy";
  const std::string sample_path = ds->cache_prefix_ + "-sample_index.npy";
  const std::string shuffle_path = ds->cache_prefix_ + "-shuffle_index.npy";
  auto cache_hit = [&] {
    return FileExists(desc_path) && FileExists(doc_path) &&
           FileExists(sample_path) && FileExists(shuffle_path);
  };

  const int rank = sync.Rank();
  absl::Status build_status;
  if (rank == 0 && !cache_hit()) {
    const absl::Time t0 = absl::Now();
    ds->indices_ = BuildGPTIndices(dataset->sequence_lengths(), begin, end,
                                   num_samples, split, config);
    ds->built_anew_ = true;
    const GPTIndices& ix = ds->indices_;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      build_status = absl::PermissionDeniedError(absl::StrCat(
          "cannot create the index cache directory ", dir, ": ", ec.message(),
          " (set --data-cache-path to a writable directory)"));
    }
    if (build_status.ok()) {
      build_status = SaveNpy(doc_path, ix.document_index,
                             {static_cast<int64_t>(ix.document_index.size())});
    }
    if (build_status.ok()) {
      build_status =
          SaveNpy(sample_path, ix.sample_index,
                  {static_cast<int64_t>(ix.sample_index.size() / 2), 2});
    }
    if (build_status.ok()) {
      build_status = SaveNpy(shuffle_path, ix.shuffle_index,
                             {static_cast<int64_t>(ix.shuffle_index.size())});
    }
    // The description goes last: its presence marks a complete cache entry.
    if (build_status.ok()) {
      build_status = WriteFileAtomically(desc_path, ds->description_);
    }
    LOG(INFO) << "built GPTDataset " << SplitName(split) << " indices for "
              << prefix << ": " << ix.shuffle_index.size() << " samples, "
              << ix.num_epochs << " epoch(s), in " << absl::Now() - t0 << " -> "
              << ds->cache_prefix_;
  }
  // Everyone waits for rank 0 even when its build failed, so that no rank
  // hangs in the barrier; the others then report the missing files.
  absl::Status barrier = sync.Barrier();
  if (!build_status.ok()) return build_status;
  if (!barrier.ok()) {
    return absl::Status(
        barrier.code(),
        absl::StrCat("rank ", rank, ": the barrier after rank 0 built the ",
                     SplitName(split), " index cache for ", prefix,
                     " failed: ", barrier.message()));
  }
  if (ds->built_anew_) return ds;

  std::vector<int64_t> shape;
  auto doc = LoadNpy<int32_t>(doc_path, &shape);
  if (!doc.ok()) {
    return absl::NotFoundError(
        absl::StrCat("rank ", rank,
                     ": cannot load the index cache rank 0 should have "
                     "written (is ",
                     dir, " shared by all ranks?): ", doc.status().message()));
  }
  auto sample = LoadNpy<int64_t>(sample_path, &shape);
  if (!sample.ok()) return sample.status();
  auto shuffle = LoadNpy<int64_t>(shuffle_path, &shape);
  if (!shuffle.ok()) return shuffle.status();
  ds->indices_.document_index = std::move(doc).value();
  ds->indices_.sample_index = std::move(sample).value();
  ds->indices_.shuffle_index = std::move(shuffle).value();
  // Validate what was loaded so a stale or damaged cache cannot read out of
  // bounds.
  const int64_t n_pairs = ds->indices_.sample_index.size() / 2;
  for (int32_t d : ds->indices_.document_index) {
    if (d < begin || d >= end) {
      return absl::DataLossError(absl::StrCat(
          doc_path, ": document ", d, " outside [", begin, ", ", end, ")"));
    }
  }
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int64_t p = ds->indices_.sample_index[2 * i];
    if (p < 0 ||
        p >= static_cast<int64_t>(ds->indices_.document_index.size())) {
      return absl::DataLossError(
          absl::StrCat(sample_path, ": entry ", i, " out of range"));
    }
  }
  absl::Status samples_ok =
      CheckSampleBounds(ds->indices_, dataset->sequence_lengths(),
                        config.sequence_length + 1, sample_path);
  if (!samples_ok.ok()) return samples_ok;
  for (int64_t s : ds->indices_.shuffle_index) {
    if (s < 0 || s >= n_pairs - 1) {
      return absl::DataLossError(
          absl::StrCat(shuffle_path, ": sample ", s, " out of range"));
    }
  }
  return ds;
}

void GPTDataset::GetSample(int64_t idx, int64_t* out) const {
  ReadSample(*dataset_, idx, kPadTokenId, out);
}

void GPTDataset::GetLossMask(int64_t idx, int64_t* out) const {
  CHECK(loss_mask_ != nullptr) << "sample " << idx << ": no loss mask";
  ReadSample(*loss_mask_, idx, 0, out);
}

absl::Status GPTDataset::AttachLossMask(
    std::shared_ptr<const IndexedDataset> mask) {
  const auto a = dataset_->sequence_lengths();
  const auto b = mask->sequence_lengths();
  if (!std::equal(a.begin(), a.end(), b.begin(), b.end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        mask->prefix(), ": the loss mask's sequence lengths differ from ",
        dataset_->prefix(), "'s (", b.size(), " sequences against ", a.size(),
        ")"));
  }
  loss_mask_ = std::move(mask);
  return absl::OkStatus();
}

void GPTDataset::ReadSample(const IndexedDataset& from, int64_t idx,
                            int64_t pad, int64_t* out) const {
  CHECK(idx >= 0 && idx < size()) << "sample " << idx << " of " << size();
  const int64_t want = config_.sequence_length + 1;
  const int64_t s = shuffle_index_[idx];
  const int64_t* pairs = indices_.sample_index.data();
  const int64_t doc_beg = pairs[2 * s], off_beg = pairs[2 * s + 1];
  const int64_t doc_end = pairs[2 * s + 2], off_end = pairs[2 * s + 3];
  const auto& didx = indices_.document_index;
  const auto lengths = from.sequence_lengths();
  int64_t n = 0;
  if (doc_beg == doc_end) {
    const int64_t len = std::min<int64_t>(off_end - off_beg + 1,
                                          lengths[didx[doc_beg]] - off_beg);
    from.Read(didx[doc_beg], off_beg, len, out);
    n = len;
  } else {
    for (int64_t d = doc_beg; d <= doc_end; ++d) {
      const int64_t seq = didx[d];
      const int64_t off = d == doc_beg ? off_beg : 0;
      int64_t len = d < doc_end ? lengths[seq] - off : off_end + 1;
      len = std::min<int64_t>(len, lengths[seq] - off);
      CHECK_LE(n + len, want) << "sample " << idx << " overruns";
      from.Read(seq, off, len, out + n);
      n += len;
    }
  }
  for (; n < want; ++n) out[n] = pad;
}

}  // namespace mcc::data
