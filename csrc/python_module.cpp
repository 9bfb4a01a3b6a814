// The Python extension module dignn_kernels._C. Importing it loads this shared library,
// whose static initializers register the dignn operators (TORCH_LIBRARY) with PyTorch's
// dispatcher, and installs the hook that lets Ctrl-C end a solve's loop
// (csrc/ops/interrupt.h). The module itself holds one attribute, schedule_constants: a dict
// of the GPU kernels' schedule constants (csrc/dignn/schedule.h), readable without a GPU.
// Left out of the CMake build, which makes a plain shared library for C++ (libtorch) users.
#include <Python.h>
#include <torch/csrc/Exceptions.h>

#include "dignn/schedule.h"
#include "ops/interrupt.h"

namespace {

// The interrupt hook: runs Python's pending signal handlers (the main thread's; elsewhere
// PyErr_CheckSignals does nothing). If one raised, its exception (KeyboardInterrupt for
// Ctrl-C) leaves the op as torch's python_error, which torch turns back into that exception
// where the op was called from Python.
void raise_pending_signals() {
  if (!Py_IsInitialized()) return;
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return;
#else
  if (_Py_IsFinalizing()) return;
#endif
  const PyGILState_STATE gil = PyGILState_Ensure();
  if (PyErr_CheckSignals() == 0) {
    PyGILState_Release(gil);
    return;
  }
  python_error error;
  error.persist();  // the exception, out of this thread's error indicator
  PyGILState_Release(gil);
  throw error;
}

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
  dignn::ops::set_interrupt_hook(&raise_pending_signals);
  return m;
}
