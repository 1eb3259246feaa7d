#include "data/blended_dataset.h"

#include <cfenv>
#include <cmath>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace mcc::data {

void BuildBlendingIndices(absl::Span<const double> weights, int64_t size,
                          std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index) {
  const size_t n = weights.size();
  CHECK_GT(n, 0u);
  std::vector<int64_t> taken(n, 0);
  dataset_index->resize(size);
  dataset_sample_index->resize(size);
  for (int64_t i = 0; i < size; ++i) {
    const double at = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * at - static_cast<double>(taken[0]);
    for (size_t d = 1; d < n; ++d) {
      const double error = weights[d] * at - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    (*dataset_index)[i] = static_cast<int16_t>(best);
    (*dataset_sample_index)[i] = taken[best];
    ++taken[best];
  }
}

std::vector<double> NormalizeWeights(absl::Span<const double> weights) {
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<double> out(weights.begin(), weights.end());
  for (double& w : out) w /= sum;
  return out;
}

absl::StatusOr<Blend> ParseDataPath(absl::Span<const std::string> words) {
  Blend blend;
  if (words.empty()) {
    return absl::InvalidArgumentError("--data-path is empty");
  }
  double first;
  const bool weighted = words.size() >= 2 && absl::SimpleAtod(words[0], &first);
  if (!weighted) {
    blend.prefixes.assign(words.begin(), words.end());
    return blend;
  }
  if (words.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data-path with weights needs pairs \"weight prefix ...\"; got ",
        words.size(), " words"));
  }
  for (size_t i = 0; i < words.size(); i += 2) {
    double w;
    if (!absl::SimpleAtod(words[i], &w) || !(w >= 0) || !std::isfinite(w)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data-path: word ", i + 1, " \"", words[i],
                       "\" must be a non-negative weight"));
    }
    blend.weights.push_back(w);
    blend.prefixes.push_back(words[i + 1]);
  }
  double sum = 0;
  for (double w : blend.weights) sum += w;
  if (sum <= 0) {
    return absl::InvalidArgumentError("--data-path weights sum to zero");
  }
  return blend;
}

absl::StatusOr<Blend> ParseDataPath(absl::string_view text) {
  std::vector<std::string> words =
      absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  return ParseDataPath(words);
}

absl::StatusOr<SplitMatrix> ParseSplit(absl::string_view text) {
  std::vector<double> parts;
  for (absl::string_view s : absl::StrSplit(text, absl::ByAnyChar(",/"))) {
    double v;
    if (!absl::SimpleAtod(s, &v) || v < 0 || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--split \"", text, "\": \"", s, "\" is not a non-negative number"));
    }
    parts.push_back(v);
  }
  if (parts.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--split \"", text, "\" has more than 3 parts"));
  }
  parts.resize(3, 0.0);
  double sum = parts[0] + parts[1] + parts[2];
  if (sum <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--split \"", text, "\" sums to zero"));
  }
  SplitMatrix m;
  double begin = 0;
  for (int i = 0; i < 3; ++i) {
    const double end = begin + parts[i] / sum;
    if (parts[i] > 0) m[i] = std::make_pair(begin, end);
    begin = end;
  }
  return m;
}

std::pair<int64_t, int64_t> SplitRange(std::pair<double, double> fractions,
                                       int64_t n) {
  // std::nearbyint rounds half to even in the default rounding mode, as
  // Python's round() does.
  const int64_t b = static_cast<int64_t>(std::nearbyint(fractions.first * n));
  const int64_t e = static_cast<int64_t>(std::nearbyint(fractions.second * n));
  return {b, std::min(e, n)};
}

absl::StatusOr<std::unique_ptr<BlendedDataset>> BlendedDataset::Create(
    std::vector<std::shared_ptr<const SampleDataset>> datasets,
    std::vector<double> weights, int64_t size) {
  if (datasets.empty() || datasets.size() != weights.size()) {
    return absl::InvalidArgumentError(absl::StrCat("blend of ", datasets.size(),
                                                   " datasets with ",
                                                   weights.size(), " weights"));
  }
  if (datasets.size() > 32767) {
    return absl::InvalidArgumentError("more than 32767 datasets in a blend");
  }
  for (size_t i = 1; i < datasets.size(); ++i) {
    if (datasets[i]->sequence_length() != datasets[0]->sequence_length()) {
      return absl::InvalidArgumentError("blended datasets differ in length");
    }
    if (datasets[i]->has_loss_mask() != datasets[0]->has_loss_mask()) {
      return absl::InvalidArgumentError(
          "blended datasets differ in having a loss mask");
    }
  }
  std::unique_ptr<BlendedDataset> b(new BlendedDataset());
  b->datasets_ = std::move(datasets);
  BuildBlendingIndices(NormalizeWeights(weights), size, &b->dataset_index_,
                       &b->dataset_sample_index_);
  for (int64_t i = 0; i < size; ++i) {
    const auto& d = b->datasets_[b->dataset_index_[i]];
    if (b->dataset_sample_index_[i] >= d->size()) {
      return absl::OutOfRangeError(absl::StrCat(
          "blended sample ", i, " needs sample ", b->dataset_sample_index_[i],
          " of dataset ", b->dataset_index_[i], " which has ", d->size()));
    }
  }
  return b;
}

void BlendedDataset::GetSample(int64_t idx, int64_t* out) const {
  CHECK(idx >= 0 && idx < size()) << "sample " << idx << " of " << size();
  datasets_[dataset_index_[idx]]->GetSample(dataset_sample_index_[idx], out);
}

void BlendedDataset::GetLossMask(int64_t idx, int64_t* out) const {
  CHECK(idx >= 0 && idx < size()) << "sample " << idx << " of " << size();
  datasets_[dataset_index_[idx]]->GetLossMask(dataset_sample_index_[idx], out);
}

absl::StatusOr<std::array<std::shared_ptr<const SampleDataset>, 3>>
BuildGPTDatasets(const Blend& blend, absl::string_view split,
                 const std::array<std::optional<int64_t>, 3>& sizes,
                 const GPTDatasetConfig& config, const RankSync& sync) {
  auto matrix_or = ParseSplit(split);
  if (!matrix_or.ok()) return matrix_or.status();
  const SplitMatrix& matrix = *matrix_or;
  const size_t k = blend.prefixes.size();
  if (k == 0) return absl::InvalidArgumentError("--data-path has no prefix");
  std::vector<double> weights;
  if (!blend.weights.empty()) weights = NormalizeWeights(blend.weights);

  // Samples per prefix per split: the target and the built (with surplus).
  std::vector<std::array<std::optional<int64_t>, 3>> target(k), buffer(k);
  for (size_t p = 0; p < k; ++p) {
    for (int i = 0; i < 3; ++i) {
      if (weights.empty() || k == 1) {
        target[p][i] = buffer[p][i] = (k == 1) ? sizes[i] : std::nullopt;
        if (k == 1 && !weights.empty()) {
          target[p][i] = buffer[p][i] = sizes[i];
        }
        continue;
      }
      if (!sizes[i].has_value()) {
        if (matrix[i].has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "a weighted --data-path needs a sample count for the ",
              SplitName(static_cast<Split>(i)), " split"));
        }
        continue;
      }
      const int64_t t = static_cast<int64_t>(
          std::ceil(static_cast<double>(*sizes[i]) * weights[p]));
      target[p][i] = t;
      buffer[p][i] =
          static_cast<int64_t>(std::ceil(static_cast<double>(t) * 1.005));
    }
  }

  std::vector<std::array<std::shared_ptr<const SampleDataset>, 3>> mids(k);
  for (size_t p = 0; p < k; ++p) {
    auto ds_or = IndexedDataset::Open(blend.prefixes[p]);
    if (!ds_or.ok()) return ds_or.status();
    std::shared_ptr<const IndexedDataset> ds = std::move(ds_or).value();
    std::shared_ptr<const IndexedDataset> mask;
    if (config.loss_mask) {
      auto mask_or = IndexedDataset::Open(LossMaskPrefix(blend.prefixes[p]));
      if (!mask_or.ok()) {
        return absl::NotFoundError(absl::StrCat(
            "--sft: ", blend.prefixes[p], " needs its loss mask beside it (",
            mask_or.status().message(),
            "); preprocess_data --sft writes both"));
      }
      mask = std::move(mask_or).value();
    }
    for (int i = 0; i < 3; ++i) {
      if (!matrix[i].has_value()) continue;
      auto [b, e] = SplitRange(*matrix[i], ds->num_sequences());
      if (b >= e) continue;
      auto g = GPTDataset::Build(ds, b, e, buffer[p][i], static_cast<Split>(i),
                                 config, sync);
      if (!g.ok()) return g.status();
      if (mask != nullptr) {
        absl::Status s = (*g)->AttachLossMask(mask);
        if (!s.ok()) return s;
      }
      mids[p][i] = std::shared_ptr<const SampleDataset>(std::move(g).value());
    }
  }

  std::array<std::shared_ptr<const SampleDataset>, 3> out;
  for (int i = 0; i < 3; ++i) {
    if (k == 1) {
      out[i] = mids[0][i];
      continue;
    }
    std::vector<std::shared_ptr<const SampleDataset>> parts;
    std::vector<double> w;
    int64_t size = 0;
    for (size_t p = 0; p < k; ++p) {
      if (mids[p][i] == nullptr) continue;
      parts.push_back(mids[p][i]);
      if (!weights.empty()) {
        w.push_back(weights[p]);
        size += *target[p][i];
      } else {
        w.push_back(static_cast<double>(mids[p][i]->size()));
        size += mids[p][i]->size();
      }
    }
    if (parts.empty()) continue;
    if (weights.empty() && sizes[i].has_value()) {
      size = std::min(size, *sizes[i]);
    }
    auto b = BlendedDataset::Create(parts, w, size);
    if (!b.ok()) return b.status();
    out[i] = std::shared_ptr<const SampleDataset>(std::move(b).value());
  }
  return out;
}

}  // namespace mcc::data
