// NumPy arrays over memory kvlens owns (no copies): `base` keeps the owner alive, and the arrays
// are read-only unless made writable on purpose (a policy's answer buffers).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

namespace kvlens::python {

namespace py = pybind11;

template <typename T>
py::array view_array(const T* data, std::vector<py::ssize_t> shape, py::handle base,
                     bool writable) {
  py::array out(py::dtype::of<T>(), std::move(shape), {}, data, base);
  if (!writable)
    py::detail::array_proxy(out.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return out;
}

template <typename T>
py::array readonly_array(const T* data, std::vector<py::ssize_t> shape, py::handle base) {
  return view_array(data, std::move(shape), base, false);
}

// U8 0/1 bytes seen as NumPy bool (the same bytes).
inline py::array bool_array(const uint8_t* data, std::vector<py::ssize_t> shape, py::handle base,
                            bool writable) {
  py::array out(py::dtype("?"), std::move(shape), {}, data, base);
  if (!writable)
    py::detail::array_proxy(out.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return out;
}

inline py::array readonly_bool_array(const uint8_t* data, std::vector<py::ssize_t> shape,
                                     py::handle base) {
  return bool_array(data, std::move(shape), base, false);
}

}  // namespace kvlens::python
