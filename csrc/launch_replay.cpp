// The native replay of a recorded plan of Triton launches (triton_kernels/launch_plan.py).
//
// A plan is one eager Triton launcher call with everything fixed but its pointers: the
// outputs' shapes and dtypes, the workspace's size, and per launch the compiled kernel
// (CUfunction), grid, threads, shared memory, cluster size, PDL and cooperative flags and
// its parameters packed as the kernel takes them (Python packs them once, from the kernel's
// signature). A replay allocates the outputs and one workspace, writes each launch's
// pointers into a copy of its parameters (an input's, an output's, or an offset into the
// workspace) and launches it with cuLaunchKernelEx, as Triton's own C launcher would, with
// none of the Python between the launches. CUDA builds only.
#ifdef SPECOPS_WITH_CUDA

#include "launch_replay.h"

#include <ATen/ATen.h>
#include <cuda.h>
#include <dlfcn.h>
#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace specops {
namespace {

namespace py = pybind11;

using LaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using GetErrorString = CUresult (*)(CUresult, const char**);

// The driver's entry points, looked up once (the extension does not link libcuda itself).
struct Driver {
  LaunchKernelEx launch = nullptr;
  GetErrorString error_string = nullptr;
};

const Driver& driver() {
  static const Driver loaded = [] {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (library == nullptr) library = dlopen("libcuda.so.1", RTLD_NOW);
    if (library == nullptr) throw std::runtime_error("specops LaunchPlan: libcuda.so.1 could not be opened");
    Driver d;
    d.launch = reinterpret_cast<LaunchKernelEx>(dlsym(library, "cuLaunchKernelEx"));
    d.error_string = reinterpret_cast<GetErrorString>(dlsym(library, "cuGetErrorString"));
    if (d.launch == nullptr) {
      throw std::runtime_error("specops LaunchPlan: cuLaunchKernelEx not found in libcuda.so.1");
    }
    return d;
  }();
  return loaded;
}

// Where a replay takes a pointer parameter from.
enum class Source : int64_t { kInput = 0, kOutput = 1, kWorkspace = 2 };

struct Patch {
  int64_t offset;  // byte offset of the 8-byte parameter in the packed parameters
  Source source;
  int64_t index;  // call argument index, output index, or byte offset into the workspace
};

struct Launch {
  CUfunction function;
  unsigned grid[3];
  unsigned threads;
  unsigned shared_memory;
  unsigned ctas;  // cluster size along x (1: no cluster)
  bool pdl;
  bool cooperative;
  std::vector<uint8_t> params;    // every parameter at an 8-byte aligned offset
  std::vector<int64_t> offsets;   // byte offset of each kernel parameter, in order
  std::vector<Patch> patches;
};

class LaunchPlan {
 public:
  // outputs: one tensor per output whose shape, dtype and device each replay's fresh
  // output takes; launches: tuples (function, (gx, gy, gz), threads, shared memory, ctas,
  // pdl, cooperative, packed parameters, parameter offsets, [(offset, source, index)]).
  LaunchPlan(const std::vector<at::Tensor>& outputs, int64_t workspace_bytes, int64_t num_inputs,
             const py::list& launches)
      : workspace_bytes_(workspace_bytes), num_inputs_(num_inputs) {
    // Checked without throwing: a malformed record leaves error() set and the plan never
    // replays (the caller then runs its launcher, which raises where the call is wrong).
    try {
      if (workspace_bytes < 0) {
        fail("LaunchPlan: workspace_bytes must be >= 0, got ", workspace_bytes);
        return;
      }
      for (const at::Tensor& output : outputs) {
        if (!output.is_cuda()) {
          fail("LaunchPlan: every output must be a CUDA tensor");
          return;
        }
        shapes_.push_back(output.sizes().vec());
        options_.push_back(output.options());
      }
      if (outputs.empty() && workspace_bytes > 0) {
        fail("LaunchPlan: a workspace needs an output's device");
        return;
      }
      for (const py::handle item : launches) {
        const auto t = item.cast<py::tuple>();
        if (t.size() != 10) {
          fail("LaunchPlan: a launch is a tuple of 10 fields, got ", t.size());
          return;
        }
        Launch launch;
        launch.function = reinterpret_cast<CUfunction>(t[0].cast<uintptr_t>());
        const auto grid = t[1].cast<std::vector<int64_t>>();
        if (grid.size() != 3) {
          fail("LaunchPlan: a grid has 3 dimensions");
          return;
        }
        for (int i = 0; i < 3; ++i) {
          if (grid[i] < 0 || grid[i] > INT32_MAX) {
            fail("LaunchPlan: grid dimension out of range");
            return;
          }
          launch.grid[i] = static_cast<unsigned>(grid[i]);
        }
        launch.threads = t[2].cast<unsigned>();
        launch.shared_memory = t[3].cast<unsigned>();
        launch.ctas = t[4].cast<unsigned>();
        if (launch.ctas < 1) {
          fail("LaunchPlan: ctas must be >= 1");
          return;
        }
        launch.pdl = t[5].cast<bool>();
        launch.cooperative = t[6].cast<bool>();
        const std::string packed = t[7].cast<std::string>();
        launch.params.assign(packed.begin(), packed.end());
        launch.offsets = t[8].cast<std::vector<int64_t>>();
        for (const int64_t offset : launch.offsets) {
          if (offset < 0 || offset % 8 != 0 || offset >= static_cast<int64_t>(launch.params.size())) {
            fail("LaunchPlan: a parameter offset lies outside the packed parameters");
            return;
          }
        }
        for (const py::handle p : t[9].cast<py::list>()) {
          const auto fields = p.cast<std::vector<int64_t>>();
          if (fields.size() != 3) {
            fail("LaunchPlan: a patch is (offset, source, index)");
            return;
          }
          Patch patch{fields[0], static_cast<Source>(fields[1]), fields[2]};
          if (patch.offset < 0 || patch.offset % 8 != 0 ||
              patch.offset + 8 > static_cast<int64_t>(launch.params.size())) {
            fail("LaunchPlan: a pointer patch lies outside the packed parameters");
            return;
          }
          switch (patch.source) {
            case Source::kInput:
              if (patch.index < 0 || patch.index >= num_inputs) {
                fail("LaunchPlan: input index out of range");
                return;
              }
              break;
            case Source::kOutput:
              if (patch.index < 0 || patch.index >= static_cast<int64_t>(shapes_.size())) {
                fail("LaunchPlan: output index out of range");
                return;
              }
              break;
            case Source::kWorkspace:
              if (patch.index < 0 || patch.index >= workspace_bytes) {
                fail("LaunchPlan: workspace offset out of range");
                return;
              }
              break;
            default:
              fail("LaunchPlan: unknown pointer source ", fields[1]);
              return;
          }
          launch.patches.push_back(patch);
        }
        launches_.push_back(std::move(launch));
      }
    } catch (...) {
      fail("LaunchPlan: a launch record field of the wrong type");
    }
  }

  const std::string& error() const { return error_; }

  // The outputs of one call, or None where it could not be made (an allocation or a launch
  // failed, a wrong number of pointers): the caller then runs the call its own way, which
  // raises the error. inputs holds each call argument's data pointer (0 for a non-tensor),
  // stream the raw CUDA stream the launches go to. Nothing is thrown out of here: a
  // catch-all turns every failure into None.
  py::object replay(const std::vector<int64_t>& inputs, int64_t stream) const {
    try {
      return py::cast(replay_or_throw(inputs, stream));
    } catch (...) {
      return py::none();
    }
  }

 private:
  std::vector<at::Tensor> replay_or_throw(const std::vector<int64_t>& inputs, int64_t stream) const {
    if (!error_.empty() || static_cast<int64_t>(inputs.size()) != num_inputs_) {
      throw std::runtime_error("LaunchPlan.replay: a malformed plan or a wrong number of pointers");
    }
    std::vector<at::Tensor> outputs;
    outputs.reserve(shapes_.size());
    for (size_t i = 0; i < shapes_.size(); ++i) outputs.push_back(at::empty(shapes_[i], options_[i]));
    at::Tensor workspace;
    uint64_t workspace_base = 0;
    if (workspace_bytes_ > 0) {
      workspace = at::empty({workspace_bytes_}, options_[0].dtype(at::kByte));
      workspace_base = reinterpret_cast<uint64_t>(workspace.data_ptr());
    }
    std::vector<uint64_t> output_pointers(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      output_pointers[i] = reinterpret_cast<uint64_t>(outputs[i].data_ptr());
    }
    std::vector<uint8_t> params;
    std::vector<void*> pointers;
    for (const Launch& launch : launches_) {
      params = launch.params;
      for (const Patch& patch : launch.patches) {
        uint64_t value = 0;
        switch (patch.source) {
          case Source::kInput: value = static_cast<uint64_t>(inputs[patch.index]); break;
          case Source::kOutput: value = output_pointers[patch.index]; break;
          case Source::kWorkspace: value = workspace_base + static_cast<uint64_t>(patch.index); break;
        }
        std::memcpy(params.data() + patch.offset, &value, sizeof(value));
      }
      pointers.resize(launch.offsets.size());
      for (size_t i = 0; i < launch.offsets.size(); ++i) pointers[i] = params.data() + launch.offsets[i];
      launch_one(launch, pointers.data(), stream);
    }
    return outputs;
  }

  static void launch_one(const Launch& launch, void** params, int64_t stream) {
    if (static_cast<uint64_t>(launch.grid[0]) * launch.grid[1] * launch.grid[2] == 0) return;  // as Triton
    CUlaunchAttribute attributes[4];
    unsigned count = 0;
    if (launch.pdl) {
      attributes[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attributes[count].value.programmaticStreamSerializationAllowed = 1;
      ++count;
    }
    if (launch.cooperative) {
      attributes[count].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attributes[count].value.cooperative = 1;
      ++count;
    }
    if (launch.ctas != 1) {
      attributes[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attributes[count].value.clusterDim.x = launch.ctas;
      attributes[count].value.clusterDim.y = 1;
      attributes[count].value.clusterDim.z = 1;
      ++count;
      attributes[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
      attributes[count].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
      ++count;
    }
    CUlaunchConfig config = {};
    config.gridDimX = launch.grid[0] * launch.ctas;
    config.gridDimY = launch.grid[1];
    config.gridDimZ = launch.grid[2];
    config.blockDimX = launch.threads;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = launch.shared_memory;
    config.hStream = reinterpret_cast<CUstream>(stream);
    config.attrs = attributes;
    config.numAttrs = count;
    const Driver& d = driver();
    const CUresult result = d.launch(&config, launch.function, params, nullptr);
    if (result != CUDA_SUCCESS) {
      const char* message = "unknown error";
      if (d.error_string != nullptr) d.error_string(result, &message);
      throw std::runtime_error(std::string("specops LaunchPlan: cuLaunchKernelEx failed: ") + message);
    }
  }

  template <typename... Parts>
  void fail(const Parts&... parts) {
    if (error_.empty()) error_ = c10::str(parts...);
  }

  std::string error_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<at::TensorOptions> options_;
  int64_t workspace_bytes_;
  int64_t num_inputs_;
  std::vector<Launch> launches_;
};

template <typename T>
void append(std::string& key, T value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// The key of a call's arguments (each tensor's sizes, strides, dtype, device, contiguity
// and 16-byte alignment; each None, bool, int and float by value) and each argument's data
// pointer (0 for a non-tensor); None where an argument is of another kind, or an int does
// not fit 64 bits (the caller keys those calls itself).
py::object plan_key(const py::tuple& args) {
  std::string key;
  key.reserve(64 * args.size());
  std::vector<int64_t> pointers;
  pointers.reserve(args.size());
  for (const py::handle item : args) {
    PyObject* object = item.ptr();
    if (THPVariable_Check(object)) {
      const at::Tensor& tensor = THPVariable_Unpack(object);
      const auto pointer = reinterpret_cast<int64_t>(tensor.data_ptr());
      key.push_back('T');
      append(key, static_cast<int64_t>(tensor.dim()));
      for (const int64_t size : tensor.sizes()) append(key, size);
      for (const int64_t stride : tensor.strides()) append(key, stride);
      append(key, static_cast<int16_t>(tensor.scalar_type()));
      append(key, static_cast<int16_t>(tensor.device().type()));
      append(key, static_cast<int16_t>(tensor.device().index()));
      key.push_back(tensor.is_contiguous() ? 'c' : 'n');
      key.push_back(pointer % 16 == 0 ? 'a' : 'u');
      pointers.push_back(pointer);
      continue;
    }
    pointers.push_back(0);
    if (object == Py_None) {
      key.push_back('N');
    } else if (PyBool_Check(object)) {
      key.push_back(object == Py_True ? 'Y' : 'F');
    } else if (PyLong_Check(object)) {
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(object, &overflow);
      if (overflow != 0) return py::none();
      key.push_back('I');
      append(key, static_cast<int64_t>(value));
    } else if (PyFloat_Check(object)) {
      key.push_back('D');
      append(key, PyFloat_AS_DOUBLE(object));
    } else {
      return py::none();
    }
  }
  return py::make_tuple(py::bytes(key), pointers);
}

}  // namespace

void define_launch_replay(py::module& m) {
  m.def("plan_key", &plan_key, py::arg("args"),
        "The key of a planned call's arguments and their data pointers (triton_kernels/launch_plan.py).");
  py::class_<LaunchPlan>(m, "LaunchPlan",
                         "A recorded plan of Triton launches, replayed without Python between them "
                         "(triton_kernels/launch_plan.py).")
      .def(py::init<const std::vector<at::Tensor>&, int64_t, int64_t, const py::list&>(), py::arg("outputs"),
           py::arg("workspace_bytes"), py::arg("num_inputs"), py::arg("launches"))
      .def("replay", &LaunchPlan::replay, py::arg("inputs"), py::arg("stream"))
      .def_property_readonly("error", &LaunchPlan::error,
                             "Why the record is malformed (it then never replays); empty when well formed.");
}

}  // namespace specops

#endif  // SPECOPS_WITH_CUDA
