// Thin checked wrappers around MPI calls: every MPI return code goes through check().
#pragma once

#include <mpi.h>

#include <string>
#include "sinew/core/error.hpp"

namespace sinew::mpi {

/// Text of an MPI error code ("MPI_ERR_TRUNCATE: message truncated").
std::string error_string(int code);

/// True if `code` reports a dead peer or a revoked communicator (ULFM's recoverable errors).
bool is_process_failure(int code) noexcept;

/// Throws CommFailure for process failures and revocations, Error otherwise, naming the call.
void check(int code, const char* call, const SourceLocation& where = SourceLocation::current());

}  // namespace sinew::mpi

/// Calls an MPI function and throws a Sinew error naming it when it does not return MPI_SUCCESS.
#define SINEW_MPI(call) ::sinew::mpi::check((call), #call)
