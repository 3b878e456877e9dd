// A synthetic Gaussian-blob classification problem, reproducible bit for bit from its seed.
#include "sinew/core/error.hpp"
#include "sinew/data/dataset.hpp"

namespace sinew::data {

Dataset make_synthetic(std::size_t n, int channels, int height, int width, int num_classes,
                       std::uint64_t seed) {
  if (channels <= 0 || height <= 0 || width <= 0)
    SINEW_THROW(InvalidArgument, "synthetic data: sample shape must be positive, got {}x{}x{}", channels,
                height, width);
  if (num_classes < 1)
    SINEW_THROW(InvalidArgument, "synthetic data: num_classes must be >= 1, got {}", num_classes);

  Dataset d;
  d.channels = channels;
  d.height = height;
  d.width = width;
  d.num_classes = num_classes;
  const auto dim = static_cast<std::size_t>(d.dim());

  // Separate streams for the class means and the samples, so the means do not depend on n and the first
  // n samples do not depend on how many follow (prefix stability).
  Rng mean_rng(Rng::mix(seed, 0x6d65616e73ULL));    // "means"
  Rng sample_rng(Rng::mix(seed, 0x73616d706cULL));  // "sampl"
  std::vector<float> means(static_cast<std::size_t>(num_classes) * dim);
  for (float& m : means) m = static_cast<float>(mean_rng.normal());

  // Noise sigma 2 against unit-variance means: neighbouring class means lie about sqrt(2 * dim) apart, so
  // the classes are separable by a linear model but not trivially (a few percent Bayes error at dim 64).
  constexpr double kNoise = 2.0;
  d.labels.resize(n);
  d.features.resize(n * dim);
  for (std::size_t i = 0; i < n; ++i) {
    const auto label =
        static_cast<std::int32_t>(sample_rng.uniform_below(static_cast<std::uint64_t>(num_classes)));
    d.labels[i] = label;
    const float* mean = means.data() + static_cast<std::size_t>(label) * dim;
    float* x = d.features.data() + i * dim;
    for (std::size_t k = 0; k < dim; ++k) x[k] = mean[k] + static_cast<float>(kNoise * sample_rng.normal());
  }
  return d;
}

}  // namespace sinew::data
