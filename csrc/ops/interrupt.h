// Interrupting a solve's loop (csrc/ops/solve.h): the loop runs in one op call, where Python
// never runs (torch releases the GIL around an op), so Ctrl-C would wait for max_iter
// iterations. The Python module (csrc/python_module.cpp) installs a hook that takes the GIL
// and runs Python's pending signal handlers; on a KeyboardInterrupt (or whatever a handler
// raises) the hook throws, the loop unwinds, its outputs are dropped and the op raises that
// exception in Python. The plain C++ library (CMakeLists.txt) installs none: there the loop
// never calls out.
//
// The loop polls after every iteration, but reads the clock only about every kClockGap of
// work (an iteration of a small graph takes less than a microsecond, a clock read tens of
// nanoseconds), and runs the hook once kInterruptInterval has passed since the loop started
// or last ran it: the GIL is taken a few times a second at most, so no solve is measurably
// slower, and a Ctrl-C ends it within the interval plus an iteration or two clock gaps.
//
// Header-only, so that no library built from these headers (the extension, the C++ library,
// the tests' CUDA emulator) needs a source file for it; the hook stays null unless the Python
// module sets it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace dignn {
namespace ops {

// Throws (with the Python error set aside in the exception) if a signal handler raised.
using InterruptHook = void (*)();

inline std::atomic<InterruptHook>& interrupt_hook() {
  static std::atomic<InterruptHook> hook{nullptr};
  return hook;
}

// Installs the hook (null: none); called once, by the Python module when it is imported.
inline void set_interrupt_hook(InterruptHook hook) {
  interrupt_hook().store(hook, std::memory_order_release);
}

inline constexpr std::chrono::milliseconds kInterruptInterval{100};
inline constexpr std::chrono::milliseconds kClockGap{1};

// One loop's polls: poll() after each iteration. The iterations between clock reads (the
// stride) double while the reads come less than kClockGap apart and halve while they come
// further apart, so that the reads settle about kClockGap apart.
class InterruptPoll {
 public:
  InterruptPoll() : hook_(interrupt_hook().load(std::memory_order_acquire)) {
    if (hook_ != nullptr) {
      last_ = Clock::now();
      next_ = last_ + kInterruptInterval;
    }
  }

  void poll() {
    if (hook_ == nullptr || --countdown_ > 0) return;
    const Clock::time_point now = Clock::now();
    stride_ = now - last_ < kClockGap ? std::min<int64_t>(2 * stride_, kMaxStride)
                                      : std::max<int64_t>(stride_ / 2, 1);
    countdown_ = stride_;
    last_ = now;
    if (now < next_) return;
    hook_();
    last_ = Clock::now();  // (the hook's wait for the GIL is no iteration's)
    next_ = last_ + kInterruptInterval;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr int64_t kMaxStride = int64_t{1} << 20;
  InterruptHook hook_;
  int64_t stride_ = 1, countdown_ = 1;
  Clock::time_point last_, next_;
};

}  // namespace ops
}  // namespace dignn
