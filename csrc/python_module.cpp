// The Python extension module dignn_kernels._C. Importing it loads this shared library,
// whose static initializers register the dignn operators (TORCH_LIBRARY) with PyTorch's
// dispatcher; the module itself defines nothing. Left out of the CMake build, which makes
// a plain shared library for C++ (libtorch) users.
#include <Python.h>

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
