// sinew-teacher's subcommands beyond `serve` (apps/sinew_teacher.cpp), and the registration of a serving
// teacher in the job's registry.
#pragma once

#include <memory>
#include <string>

namespace sinew::serve {
class TeacherServer;
}

namespace sinew::apps {

/// sinew-teacher precompute --checkpoint P --out F: the logits of every training sample into an HDF5 table.
int precompute_main(int argc, char** argv);

/// sinew-teacher autoscale ...: starts and stops teachers (serve/autoscaler.hpp).
int autoscale_main(int argc, char** argv);

/// Keeps `server` registered under /sinew/<job>/teachers/<its id> with a lease of `ttl_s` seconds, its
/// value refreshed with the measured throughput every second; the destructor revokes the lease, so that
/// students drop the teacher at once. Throws ServiceError when the registry cannot be reached.
class TeacherRegistration {
 public:
  TeacherRegistration(const std::string& registry, const std::string& job, serve::TeacherServer& server,
                      int ttl_s = 3);
  TeacherRegistration(const TeacherRegistration&) = delete;
  TeacherRegistration& operator=(const TeacherRegistration&) = delete;
  ~TeacherRegistration();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sinew::apps
