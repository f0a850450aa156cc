// opscope's native script engine: a RecordFunction observer that records the ATen ops a Python
// dispatch mode would see, at a fraction of its cost. Python (profiler/native/__init__.py) builds
// this once with torch.utils.cpp_extension, sets the current module and phase from its hooks, and
// drains the buffer per step into the same sites and events the eager engine produces.
//
// Which ops: a dispatch mode sits below autograd and sees each top-level call that is not
// CompositeImplicitAutograd (those decompose before it); calls made from inside another op's kernel
// never reach it. RecordFunction fires for every dispatcher call, so this observer skips composite
// overloads and everything nested inside an op it records.
//
// Per recorded op the end callback interns a *signature* (op, input and output shapes and dtypes) and
// a *site* (signature, module, phase, occurrence of the op in the step, forward site for a backward
// op), then appends one event row: site, position in the step, start and end ns, thread.
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace py = pybind11;

namespace {

inline int64_t now_ns() {  // CLOCK_MONOTONIC: the clock of Python's time.perf_counter_ns on Linux
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t thread_id() {
#ifdef __linux__
  return static_cast<int64_t>(syscall(SYS_gettid));  // threading.get_native_id()
#else
  return static_cast<int64_t>(std::hash<std::thread::id>()(std::this_thread::get_id()) & 0x7fffffff);
#endif
}

struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const noexcept {
    size_t h = v.size();
    for (int64_t x : v) h ^= static_cast<size_t>(x) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

struct Name {          // one op overload
  std::string name, overload;
  int packet;          // index into packets (occurrences are counted per packet, like the eager engine)
};

struct Event { int64_t site, pos, t0, t1, tid; };

// --- state shared by all threads (under mu) ---------------------------------------------------
std::mutex mu;
std::vector<Name> names;
std::unordered_map<std::string, int> name_ids;       // "aten::add.Tensor" -> index in names (-1: composite)
std::unordered_map<std::string, int> packet_ids;
std::unordered_map<std::vector<int64_t>, int64_t, VecHash> sigs, sites;
std::vector<std::vector<int64_t>> new_sigs, new_sites;
size_t names_sent = 0;
std::vector<Event> events;
// this step
std::vector<int64_t> step_site, step_module, packet_counts;
std::unordered_map<int64_t, int64_t> fwd_pos;          // autograd sequence number -> position of the forward op
int64_t step_pos = 0;
std::atomic<int64_t> g_module{0}, g_phase{0};          // set from Python's module and optimizer hooks
bool installed = false;
at::CallbackHandle handle = 0;

// --- per thread --------------------------------------------------------------------------------
struct Open {
  int name = -1;
  int64_t t0 = 0, seq = -1, bwd_seq = -1;
  bool backward = false;          // autograd's engine runs it (AccumulateGrad's node has no usable number)
  std::vector<int64_t> key;
};
thread_local int tl_nested = 0;        // dispatcher calls open inside the recorded one
thread_local bool tl_open = false;
thread_local Open tl_op;
thread_local int64_t tl_tid = -1;
// name pointer -> (id, the name it was made for): no lock on the hot path
thread_local std::unordered_map<const void*, std::pair<int, std::string>> tl_names;

int classify(const at::RecordFunction& fn) {
  const char* nm = fn.name();
  auto it = tl_names.find(nm);
  // NOTE: the pointer is only a cache key: a name a RecordFunction owns (not a dispatcher schema's) may
  // be freed and its address reused for another name, so a hit is checked against the name itself
  if (it != tl_names.end() && std::strcmp(it->second.second.c_str(), nm) == 0) return it->second.first;
  // first time on this thread: an overload is recorded unless it is CompositeImplicitAutograd
  std::string full = nm;
  std::string ov = fn.overload_name();
  std::string key = full + "." + ov;
  int id;
  {
    std::lock_guard<std::mutex> g(mu);
    auto f = name_ids.find(key);
    if (f != name_ids.end()) {
      id = f->second;
    } else {
      // not a dispatcher op (the autograd engine's `evaluate_function: MulBackward0` range): see through it
      bool skip = true;
      auto opname = fn.operator_name();
      if (opname) {
        auto h = c10::Dispatcher::singleton().findOp(*opname);
        skip = h && h->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
      }
      if (skip) {
        id = -1;
      } else {
        auto p = packet_ids.emplace(full, static_cast<int>(packet_ids.size())).first->second;
        id = static_cast<int>(names.size());
        names.push_back({full, ov, p});
      }
      name_ids.emplace(key, id);
    }
  }
  tl_names[nm] = {id, full};
  return id;
}

void add_values(std::vector<int64_t>& key, c10::ArrayRef<const c10::IValue> vals) {
  auto add = [&key](const at::Tensor& t) {
    // a Python number passed for a Tensor argument (`x.add_(1)`) is a wrapped number here; a dispatch
    // mode gets the number back, so it is no tensor input for the eager engine either
    if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
    if (t.is_nested()) {
      key.push_back(-1);
    } else {
      auto s = t.sizes();
      key.push_back(static_cast<int64_t>(s.size()));
      key.insert(key.end(), s.begin(), s.end());
    }
    key.push_back(static_cast<int64_t>(t.scalar_type()));
  };
  size_t at = key.size();
  key.push_back(0);
  for (const auto& v : vals) {
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList()) {
      for (const auto& t : v.toTensorList()) add(t);
    } else if (v.isList()) {
      for (const auto& e : v.toListRef()) if (e.isTensor()) add(e.toTensor());
    } else {
      continue;
    }
  }
  key[at] = static_cast<int64_t>(key.size() - at - 1);
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (tl_open) {
    ++tl_nested;
    return nullptr;
  }
  int id = classify(fn);
  if (id < 0) return nullptr;
  tl_open = true;
  tl_nested = 0;
  Open& op = tl_op;
  op.name = id;
  op.seq = fn.seqNr();
  auto node = torch::autograd::get_current_node();
  op.backward = static_cast<bool>(node);
  op.bwd_seq = node ? static_cast<int64_t>(node->sequence_nr()) : -1;
  op.key.clear();
  op.key.push_back(id);
  add_values(op.key, fn.inputs());
  op.t0 = now_ns();
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  if (!tl_open) return;                  // a composite op's end
  if (tl_nested > 0) {
    --tl_nested;
    return;
  }
  int64_t t1 = now_ns();
  tl_open = false;
  Open& op = tl_op;
  const auto& outs = fn.outputs();
  add_values(op.key, c10::ArrayRef<const c10::IValue>(outs.data(), outs.size()));
  if (tl_tid < 0) tl_tid = thread_id();

  std::lock_guard<std::mutex> g(mu);
  auto s = sigs.find(op.key);
  int64_t sig;
  if (s == sigs.end()) {
    sig = static_cast<int64_t>(sigs.size());
    sigs.emplace(op.key, sig);
    std::vector<int64_t> row{sig};
    row.insert(row.end(), op.key.begin(), op.key.end());
    new_sigs.push_back(std::move(row));
  } else {
    sig = s->second;
  }
  int64_t pos = step_pos++;
  int64_t phase, module, fwd_site = -1;
  if (op.backward) {                     // autograd's engine runs this op: the backward of a forward call
    phase = 1;
    module = -1;
    auto f = op.bwd_seq >= 0 ? fwd_pos.find(op.bwd_seq) : fwd_pos.end();
    if (f != fwd_pos.end()) {
      fwd_site = step_site[f->second];
      module = step_module[f->second];
    }
  } else {
    phase = g_phase.load(std::memory_order_relaxed);
    module = g_module.load(std::memory_order_relaxed);
    // the node numbered N is made by the last call that sees N as the next number (calls before it
    // made no node: `.item()`, ops under no_grad; calls after it see N + 1)
    if (op.seq >= 0) fwd_pos[op.seq] = pos;
  }
  int packet = names[op.name].packet;
  if (static_cast<size_t>(packet) >= packet_counts.size()) packet_counts.resize(packet + 1, 0);
  int64_t k = packet_counts[packet]++;
  std::vector<int64_t> skey{sig, module, phase, k, fwd_site};
  auto st = sites.find(skey);
  int64_t site;
  if (st == sites.end()) {
    site = static_cast<int64_t>(sites.size());
    sites.emplace(skey, site);
    new_sites.push_back({site, sig, module, phase, k, fwd_site});
  } else {
    site = st->second;
  }
  step_site.push_back(site);
  step_module.push_back(module);
  events.push_back({site, pos, op.t0, t1, tl_tid});
}

void start() {
  std::lock_guard<std::mutex> g(mu);
  if (installed) return;
  handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                     .needsInputs(true)
                                     .needsOutputs(true)
                                     .scopes({at::RecordScope::FUNCTION}));
  installed = true;
}

void stop() {
  std::lock_guard<std::mutex> g(mu);
  if (!installed) return;
  at::removeCallback(handle);
  installed = false;
}

py::tuple drain() {
  std::vector<Event> evs;
  std::vector<std::vector<int64_t>> nsig, nsite;
  std::vector<Name> nnames;
  {
    std::lock_guard<std::mutex> g(mu);
    evs.swap(events);
    nsig.swap(new_sigs);
    nsite.swap(new_sites);
    nnames.assign(names.begin() + names_sent, names.end());
    names_sent = names.size();
  }
  py::bytes ev(reinterpret_cast<const char*>(evs.data()), evs.size() * sizeof(Event));
  py::list pn, ps, pt;
  size_t first = names_sent - nnames.size();
  for (size_t i = 0; i < nnames.size(); ++i)
    pn.append(py::make_tuple(first + i, nnames[i].name, nnames[i].overload));
  for (auto& r : nsig) ps.append(py::cast(r));
  for (auto& r : nsite) pt.append(py::cast(r));
  return py::make_tuple(ev, pn, ps, pt);
}

int64_t end_step() {   // after drain(): the next ops start a new step
  std::lock_guard<std::mutex> g(mu);
  int64_t n = step_pos;
  step_site.clear();
  step_module.clear();
  std::fill(packet_counts.begin(), packet_counts.end(), 0);
  fwd_pos.clear();
  step_pos = 0;
  return n;
}

void reset() {   // a new engine (a new run in this process): sites and signatures start again from 0
  std::lock_guard<std::mutex> g(mu);
  sigs.clear();
  sites.clear();
  new_sigs.clear();
  new_sites.clear();
  events.clear();
  names_sent = 0;   // names keep their ids (threads cache them); the new engine is told them all again
  step_site.clear();
  step_module.clear();
  std::fill(packet_counts.begin(), packet_counts.end(), 0);
  fwd_pos.clear();
  step_pos = 0;
  g_module = 0;
  g_phase = 0;
}

int64_t step_ops() {
  std::lock_guard<std::mutex> g(mu);
  return step_pos;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start, "install the RecordFunction observer");
  m.def("stop", &stop, "remove it");
  m.def("drain", &drain, "(events bytes, new names, new signatures, new sites) since the last drain");
  m.def("end_step", &end_step, "reset the per-step state; returns the ops the step had");
  m.def("reset", &reset, "forget sites, signatures and events: a new run starts");
  m.def("step_ops", &step_ops, "ops recorded in the current step so far");
  m.def("set_module", [](int64_t m) { g_module.store(m, std::memory_order_relaxed); });
  m.def("set_phase", [](int64_t p) { g_phase.store(p, std::memory_order_relaxed); });
  m.def("scalar_type", [](const at::Tensor& t) { return static_cast<int64_t>(t.scalar_type()); });
  m.def("event_bytes", []() { return static_cast<int64_t>(sizeof(Event)); });
}
