#include "data/loader.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mcc::data {

int64_t FirstSampleOfMicroBatch(int64_t consumed, int64_t micro_batch_size,
                                int dp_rank) {
  return consumed + static_cast<int64_t>(dp_rank) * micro_batch_size;
}

MicroBatch MakeMicroBatch(const SampleDataset& dataset, int64_t first,
                          const LoaderConfig& c) {
  const int64_t b = c.micro_batch_size;
  const int64_t s = dataset.sequence_length();
  MicroBatch mb;
  mb.tokens = Tensor::Empty({b, s}, DType::kInt64);
  mb.labels = Tensor::Empty({b, s}, DType::kInt64);
  mb.loss_mask = Tensor::Empty({b, s}, DType::kFloat32);
  mb.position_ids = Tensor::Empty({b, s}, DType::kInt64);
  int64_t* tokens = mb.tokens.data<int64_t>();
  int64_t* labels = mb.labels.data<int64_t>();
  float* mask = mb.loss_mask.data<float>();
  int64_t* pos = mb.position_ids.data<int64_t>();
  const bool documents = c.eod >= 0 && c.reset_attention_mask;
  if (documents) mb.document_start = Tensor::Empty({b, s}, DType::kInt32);
  std::vector<int64_t> sample(s + 1);
  const bool masked = dataset.has_loss_mask();
  std::vector<int64_t> sample_mask(masked ? s + 1 : 0);
  for (int64_t r = 0; r < b; ++r) {
    dataset.GetSample(first + r, sample.data());
    if (masked) dataset.GetLossMask(first + r, sample_mask.data());
    int64_t p = 0, start = 0;
    for (int64_t i = 0; i < s; ++i) {
      if (documents) {
        mb.document_start.data<int32_t>()[r * s + i] =
            static_cast<int32_t>(start);
        if (sample[i] == c.eod) start = i + 1;
      }
      const int64_t t = sample[i], l = sample[i + 1];
      tokens[r * s + i] = t == kPadTokenId ? 0 : t;
      labels[r * s + i] = l == kPadTokenId ? 0 : l;
      float m = l == kPadTokenId ? 0.f : 1.f;
      if (c.eod >= 0 && c.eod_mask_loss && t == c.eod) m = 0.f;
      // The label's own mask: position i predicts token i + 1.
      if (masked && sample_mask[i + 1] == 0) m = 0.f;
      mask[r * s + i] = m;
      pos[r * s + i] = p++;
      if (c.eod >= 0 && c.reset_position_ids && t == c.eod) p = 0;
    }
  }
  return mb;
}

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(
    std::shared_ptr<const SampleDataset> dataset, const LoaderConfig& config) {
  if (config.micro_batch_size < 1 || config.dp_size < 1 || config.dp_rank < 0 ||
      config.dp_rank >= config.dp_size || config.consumed_samples < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data loader: micro batch size ", config.micro_batch_size,
        ", data-parallel rank ", config.dp_rank, " of ", config.dp_size,
        ", consumed samples ", config.consumed_samples, " are not valid"));
  }
  if (dataset == nullptr) {
    return absl::InvalidArgumentError("data loader: no dataset");
  }
  std::unique_ptr<DataLoader> l(new DataLoader());
  l->dataset_ = std::move(dataset);
  l->config_ = config;
  l->consumed_ = config.consumed_samples;
  l->stride_ = config.micro_batch_size * config.dp_size;
  if (config.needs_data)
    l->thread_ = std::thread([p = l.get()] { p->Produce(); });
  return l;
}

DataLoader::~DataLoader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t DataLoader::remaining() const {
  return (dataset_->size() - consumed_) / stride_;
}

void DataLoader::Produce() {
  int64_t consumed = config_.consumed_samples;
  const int depth = std::max(1, config_.prefetch);
  while (consumed + stride_ <= dataset_->size()) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, depth]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || static_cast<int>(queue_.size()) < depth;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
    }
    MicroBatch mb =
        MakeMicroBatch(*dataset_,
                       FirstSampleOfMicroBatch(
                           consumed, config_.micro_batch_size, config_.dp_rank),
                       config_);
    consumed += stride_;
    mb.consumed_samples = consumed;
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(mb));
  }
  absl::MutexLock lock(&mu_);
  done_ = true;
}

absl::StatusOr<MicroBatch> DataLoader::Next() {
  if (consumed_ + stride_ > dataset_->size()) {
    return absl::OutOfRangeError(
        absl::StrCat("data loader: dataset of ", dataset_->size(),
                     " samples exhausted at ", consumed_,
                     " consumed samples (global "
                     "micro-batch of ",
                     stride_, ")"));
  }
  if (!config_.needs_data) {
    MicroBatch mb;
    consumed_ += stride_;
    mb.consumed_samples = consumed_;
    return mb;
  }
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || done_;
  };
  mu_.Await(absl::Condition(&ready));
  CHECK(!queue_.empty()) << "data loader thread ended early";
  MicroBatch mb = std::move(queue_.front());
  queue_.pop_front();
  consumed_ = mb.consumed_samples;
  return mb;
}

}  // namespace mcc::data
