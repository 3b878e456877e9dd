// A program outside the Sinew tree that uses an installed Sinew, found with find_package(Sinew) or with
// `pkg-config --cflags --libs sinew` (tests/install/install_test.sh), and prints the MPI library it runs on.
// It is compiled without the CPU tuning of the Sinew build, so the model below also checks the ABI between
// the two: libsinew allocates the model's Eigen buffers, and this program's inline code (~Model, Matrix)
// frees them.
#include <sinew/comm/bucketer.hpp>
#include <sinew/config.hpp>
#include <sinew/model/model.hpp>
#include <sinew/mpi/environment.hpp>
#include <sinew/train/trainer.hpp>

#include <cstdio>
#include <utility>

int main() {
  // Links and loads libmpi (MPI_Get_library_version needs no MPI_Init): the test checks which one is loaded.
  std::printf("sinew %s (ULFM %d) on %s\n", SINEW_VERSION, SINEW_HAVE_ULFM,
              sinew::mpi::library_version().c_str());
  if (sinew::comm::dtype_size(sinew::comm::DType::kFloat32) != 4) {
    return 1;
  }
  const sinew::model::Shape input{1, 6, 6};
  sinew::model::Model model = sinew::model::Model::build("mlp:16,8", input, 3, 7);
  sinew::model::Matrix batch = sinew::model::Matrix::Random(input.size(), 5);  // allocated here
  const sinew::model::Matrix dlogits = model.forward(batch) / 5.0F;            // logits held by libsinew
  model.backward(dlogits);
  sinew::model::Model copy = model.clone();
  model = std::move(copy);  // frees the first model's buffers here
  batch.resize(input.size(), 64);
  const sinew::model::Matrix& logits = model.forward(batch);
  std::printf("model %s: %zu parameters, logits %ldx%ld\n", model.spec().c_str(), model.num_params(),
              static_cast<long>(logits.rows()), static_cast<long>(logits.cols()));
  return model.num_params() > 0 && logits.rows() == 3 ? 0 : 1;
}
