# The PyTorch integration (src/sinew/torch, python/): libtorch and pybind11, found through a Python that has
# torch and pybind11 installed (mpi_scripts/setup.sh puts them into a virtual environment, SINEW_PYTHON).
#
# Sets SINEW_HAVE_TORCH (0/1) and, with it, the imported target sinew_torch_deps (libtorch for C++),
# sinew_torch_python_deps (libtorch_python, for the Python module) and SINEW_PYTHON_EXECUTABLE.
#
# Torch is located with torch.utils.cmake_prefix_path, the directory of its CMake package. Its headers and
# libraries are taken from there directly instead of through find_package(Torch): PyPI's Linux wheels are
# CUDA builds, and TorchConfig.cmake then insists on a CUDA toolkit matching the wheel's on the build machine
# (and sets nvcc flags for eleven architectures), although a CPU tensor needs none of it. The CPU libraries
# (libtorch, libtorch_cpu, libc10) are what Sinew links; the wheel's own run path finds the rest.
set(SINEW_HAVE_TORCH 0)
if(SINEW_TORCH STREQUAL "OFF")
  message(STATUS "Sinew: PyTorch integration off (-DSINEW_TORCH=OFF)")
  return()
endif()

function(_sinew_torch_missing why)
  if(SINEW_TORCH STREQUAL "ON")
    message(FATAL_ERROR "SINEW_TORCH=ON but ${why}. Run mpi_scripts/setup.sh (it installs torch, torchvision and "
                        "pybind11 into a virtual environment), point -DSINEW_PYTHON at a Python that has them, or "
                        "configure with -DSINEW_TORCH=AUTO|OFF")
  endif()
  message(STATUS "Sinew: PyTorch integration not built: ${why}")
endfunction()

if(NOT SINEW_PYTHON)
  if(DEFINED ENV{SINEW_TORCH_VENV} AND EXISTS "$ENV{SINEW_TORCH_VENV}/bin/python")
    set(SINEW_PYTHON "$ENV{SINEW_TORCH_VENV}/bin/python")
  elseif(EXISTS /opt/sinew/torch-venv/bin/python)
    set(SINEW_PYTHON /opt/sinew/torch-venv/bin/python)
  else()
    set(SINEW_PYTHON /usr/bin/python3)
  endif()
endif()
execute_process(
  COMMAND "${SINEW_PYTHON}" -c "import torch, pybind11, torch.utils, sys
print(torch.__version__.split('+')[0])
print(torch.utils.cmake_prefix_path)
print(int(torch.compiled_with_cxx11_abi()))
print(pybind11.get_cmake_dir())
print(sys.version_info[0], sys.version_info[1], sep='.')"
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _rc EQUAL 0)
  string(REGEX REPLACE "\n.*" "" _err "${_err}")
  _sinew_torch_missing("${SINEW_PYTHON} cannot import torch and pybind11 (${_err})")
  return()
endif()
string(REPLACE "\n" ";" _out "${_out}")
list(GET _out 0 SINEW_TORCH_VERSION)
list(GET _out 1 _torch_cmake)
list(GET _out 2 _torch_abi)
list(GET _out 3 _pybind11_dir)
list(GET _out 4 _py_version)
# register_post_accumulate_grad_hook (the gradient-ready hook) came with 2.1.
if(SINEW_TORCH_VERSION VERSION_LESS 2.1)
  _sinew_torch_missing("torch ${SINEW_TORCH_VERSION} in ${SINEW_PYTHON} is older than 2.1, which Sinew needs for "
                       "its post-accumulate-grad hooks; install torch >= 2.1")
  return()
endif()
# libsinew and Debian's C++ libraries it links (fmt, spdlog, Boost) use the C++11 ABI; a torch built with the
# old one (PyPI's wheels before 2.7) cannot share a std::string with them.
if(NOT _torch_abi EQUAL 1)
  _sinew_torch_missing("torch ${SINEW_TORCH_VERSION} in ${SINEW_PYTHON} was built with the pre-C++11 ABI "
                       "(torch.compiled_with_cxx11_abi() is False), Sinew with the C++11 ABI; install torch >= 2.7 "
                       "from PyPI")
  return()
endif()
get_filename_component(_torch_root "${_torch_cmake}/../.." ABSOLUTE)
set(_torch_libs "")
foreach(lib torch torch_cpu c10)
  find_library(_lib_${lib} ${lib} PATHS "${_torch_root}/lib" NO_DEFAULT_PATH)
  if(NOT _lib_${lib})
    _sinew_torch_missing("lib${lib}.so is not in ${_torch_root}/lib")
    return()
  endif()
  list(APPEND _torch_libs ${_lib_${lib}})
endforeach()
find_library(_lib_torch_python torch_python PATHS "${_torch_root}/lib" NO_DEFAULT_PATH)
# A CUDA build of Torch (PyPI's Linux wheels are): libc10_cuda has torch's CUDA streams, which models on a
# GPU need (src/CMakeLists.txt; only where Sinew itself is built with CUDA).
find_library(SINEW_TORCH_CUDA_LIBRARY c10_cuda PATHS "${_torch_root}/lib" NO_DEFAULT_PATH)

set(Python_EXECUTABLE "${SINEW_PYTHON}")
set(PYBIND11_FINDPYTHON ON)
find_package(Python ${_py_version} EXACT COMPONENTS Interpreter Development.Module)
if(NOT Python_FOUND)
  _sinew_torch_missing("the headers of Python ${_py_version} (python3-dev) are missing")
  return()
endif()
find_package(pybind11 CONFIG PATHS "${_pybind11_dir}" NO_DEFAULT_PATH)
if(NOT pybind11_FOUND OR NOT _lib_torch_python)
  _sinew_torch_missing("pybind11's CMake package or libtorch_python is missing")
  return()
endif()

add_library(sinew_torch_deps INTERFACE)
# -idirafter, not -isystem: torch's include directory carries its own fmt (12) and protobuf headers, which
# must not shadow the Debian ones that libsinew and spdlog are built with; torch's own headers are found
# there all the same, after the system directories.
target_compile_options(sinew_torch_deps INTERFACE "SHELL:-idirafter ${_torch_root}/include"
                                                  "SHELL:-idirafter ${_torch_root}/include/torch/csrc/api/include")
target_link_libraries(sinew_torch_deps INTERFACE ${_torch_libs})
# libtorch needs libtorch_cuda, which needs the CUDA and NCCL libraries of the nvidia-* wheels next to torch;
# the libraries find them at run time by their own run path, the linker of an executable only if told.
file(GLOB _torch_nvidia_libs LIST_DIRECTORIES true "${_torch_root}/../nvidia/*/lib")
foreach(dir IN LISTS _torch_nvidia_libs)
  target_link_options(sinew_torch_deps INTERFACE "LINKER:-rpath-link,${dir}")
endforeach()
target_compile_definitions(sinew_torch_deps INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
add_library(sinew_torch_python_deps INTERFACE)
target_link_libraries(sinew_torch_python_deps INTERFACE sinew_torch_deps ${_lib_torch_python})
set(SINEW_PYTHON_EXECUTABLE "${SINEW_PYTHON}")
set(SINEW_TORCH_ROOT "${_torch_root}")
set(SINEW_HAVE_TORCH 1)
message(STATUS "Sinew: PyTorch ${SINEW_TORCH_VERSION} from ${_torch_root}, Python ${_py_version} "
               "(${SINEW_PYTHON}), pybind11 ${pybind11_VERSION}")
