// The student's side of the teacher service: teachers discovered in the registry, requests spread over
// them by the balancer, and a request that a teacher fails (dead, hung, gone) sent to another within its
// deadline. docs/distillation.md.
#pragma once

#include <memory>
#include <string>

#include "sinew/distill/source.hpp"

namespace sinew::serve {

/// Registry layout: every key of a job lies under /sinew/<job>/.
std::string teachers_prefix(const std::string& job);  ///< "/sinew/<job>/teachers/"
std::string students_prefix(const std::string& job);  ///< "/sinew/<job>/students/"

/// The teacher service of `spec.job`, as a logit source: watches the registry, keeps a client per teacher,
/// registers this student (with its reports, the autoscaler's input) under a lease. Throws ServiceError
/// when the registry cannot be reached at all. Teachers may come and go at any time, none at the start
/// included: a request with no teacher fails (ServiceError) and the Distiller's policy decides.
std::unique_ptr<distill::LogitSource> service_source(const distill::ServiceSpec& spec);

}  // namespace sinew::serve
