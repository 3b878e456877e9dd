#include "sinew/comm/backend.hpp"

namespace sinew::comm {

std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
    case DType::kUInt64:
      return 8;
    case DType::kUInt8:
      return 1;
  }
  return 1;
}

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::kFloat32:
      return "float";
    case DType::kFloat64:
      return "double";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt64:
      return "uint64";
    case DType::kUInt8:
      return "uint8";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

}  // namespace sinew::comm
