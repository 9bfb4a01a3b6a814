// The Python extension module dignn_kernels._C. Importing it loads this shared library,
// whose static initializers register the dignn operators (TORCH_LIBRARY) with PyTorch's
// dispatcher. The module itself holds one attribute, schedule_constants: a dict of the GPU
// kernels' schedule constants (csrc/dignn/schedule.h), readable without a GPU. Left out of
// the CMake build, which makes a plain shared library for C++ (libtorch) users.
#include <Python.h>

#include "dignn/schedule.h"

namespace {

PyObject* schedule_constants() {
  PyObject* dict = PyDict_New();
  if (dict == nullptr) return nullptr;
  for (const dignn::ScheduleConstant& c : dignn::kScheduleConstants) {
    PyObject* value = PyLong_FromLongLong(c.value);
    const int failed = value == nullptr || PyDict_SetItemString(dict, c.name, value) != 0;
    Py_XDECREF(value);
    if (failed) {
      Py_DECREF(dict);
      return nullptr;
    }
  }
  return dict;
}

}  // namespace

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
  PyObject* constants = schedule_constants();
  if (constants == nullptr || PyModule_AddObject(m, "schedule_constants", constants) != 0) {
    Py_XDECREF(constants);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
