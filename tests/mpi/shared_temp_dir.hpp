// A temporary directory shared by the ranks of a communicator, for multi-rank tests: rank 0 creates it
// with mkdtemp and broadcasts its name; the destructor (after a barrier, so no rank still uses it)
// removes it.
#pragma once

#include <mpi.h>
#include <stdlib.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <string>

namespace sinew::test {

class SharedTempDir {
 public:
  explicit SharedTempDir(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    std::array<char, 4096> name{};
    if (rank() == 0) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "sinew-test-XXXXXX").string();  // mkdtemp
      if (::mkdtemp(tmpl.data()) != nullptr && tmpl.size() < name.size()) {
        std::memcpy(name.data(), tmpl.c_str(), tmpl.size() + 1);
      }
    }
    MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, comm_);
    path_ = name.data();
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  ~SharedTempDir() {
    MPI_Barrier(comm_);
    if (rank() == 0 && !path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] std::string operator/(const std::string& sub) const {
    return (std::filesystem::path(path_) / sub).string();
  }

 private:
  [[nodiscard]] int rank() const {
    int r = 0;
    MPI_Comm_rank(comm_, &r);
    return r;
  }
  MPI_Comm comm_;
  std::string path_;
};

}  // namespace sinew::test
