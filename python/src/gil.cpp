// Interpreter shutdown with kvq calls in flight (issue #36).
//
// At exit, Python finalizes while daemon threads may still be inside kvq with the GIL released. A thread
// that then takes the GIL back is ended by the interpreter with pthread_exit, whose forced unwinding
// through pybind11's noexcept GIL guard aborts the process (SIGABRT), and one still running kvq code while
// the process's static objects are destroyed may crash. So kvq registers an atexit function, which
// Python runs before it finalizes: it marks the interpreter as exiting and waits, without the GIL, until
// no call is inside kvq. From then on a thread that finishes a call, or begins one, never takes the GIL
// again: it sleeps until the process ends (what Python 3.14 does with daemon threads itself). A thread
// that takes the GIL back before the mark holds `mu` until it has it, so the mark waits for it.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "bindings.hpp"

namespace kvq::python {
namespace {

struct ExitState {
    std::mutex mu;
    std::condition_variable idle;
    int in_flight = 0;
    bool exiting = false;
};

// Never destroyed: parked threads and calls still finishing use it while static objects go.
ExitState& exit_state() {
    static auto* s = new ExitState;
    return *s;
}

[[noreturn]] void park() {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

void wait_for_calls_at_exit() {
    ExitState& s = exit_state();
    py::gil_scoped_release unlocked;  // calls finishing now need the GIL back
    std::unique_lock<std::mutex> lock(s.mu);
    s.exiting = true;
    s.idle.wait(lock, [&] { return s.in_flight == 0; });
}

void bind_exit(py::module_&) {
    py::module_::import("atexit").attr("register")(py::cpp_function(&wait_for_calls_at_exit));
}

const Registration registration("exit", bind_exit);

}  // namespace

WithoutGil::WithoutGil() : saved_(PyEval_SaveThread()) {
    ExitState& s = exit_state();
    std::unique_lock<std::mutex> lock(s.mu);
    if (s.exiting) {
        lock.unlock();
        park();
    }
    ++s.in_flight;
}

WithoutGil::~WithoutGil() {
    ExitState& s = exit_state();
    std::unique_lock<std::mutex> lock(s.mu);
    if (--s.in_flight == 0) s.idle.notify_all();
    if (s.exiting) {
        lock.unlock();
        park();
    }
    PyEval_RestoreThread(static_cast<PyThreadState*>(saved_));
}

WithGil::WithGil() {
    {
        ExitState& s = exit_state();
        std::lock_guard<std::mutex> lock(s.mu);
        // The interpreter waits for this call to end: end it early rather than run Python code now.
        if (s.exiting) throw std::runtime_error("the Python interpreter is exiting");
    }
    state_ = PyGILState_Ensure();
}

WithGil::~WithGil() { PyGILState_Release(static_cast<PyGILState_STATE>(state_)); }

}  // namespace kvq::python
