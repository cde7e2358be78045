// The sizes of a caller's buffers, worked out from the counts, strides and dimensions it passes with every
// product and sum checked. No buffer holds more than PTRDIFF_MAX bytes, so a size beyond that (or one whose
// arithmetic would wrap) can only come from a wrong argument: it is refused before anything is read or
// written. Every entry point that takes a count, a stride or a size computes its buffers' sizes here (the
// table in docs/reliability.md lists them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace kvq::detail {

inline constexpr size_t kMaxBufferBytes = static_cast<size_t>(PTRDIFF_MAX);

// A size that saturates: a value, product or sum beyond kMaxBufferBytes is too_large(), and stays so
// through every later step (a too-large factor makes a product too large even when the other is 0).
class CheckedSize {
public:
    constexpr CheckedSize(size_t v = 0) : v_(v > kMaxBufferBytes ? kTooLarge : v) {}  // NOLINT: implicit on purpose
    constexpr bool too_large() const { return v_ == kTooLarge; }
    constexpr size_t value() const { return v_; }  // meaningful when !too_large()

    friend constexpr CheckedSize operator*(CheckedSize a, CheckedSize b) {
        size_t r = 0;
        if (a.too_large() || b.too_large() || __builtin_mul_overflow(a.v_, b.v_, &r)) return large();
        return CheckedSize(r);
    }
    friend constexpr CheckedSize operator+(CheckedSize a, CheckedSize b) {
        size_t r = 0;
        if (a.too_large() || b.too_large() || __builtin_add_overflow(a.v_, b.v_, &r)) return large();
        return CheckedSize(r);
    }

private:
    static constexpr size_t kTooLarge = SIZE_MAX;
    static constexpr CheckedSize large() { return CheckedSize(kTooLarge); }
    size_t v_;
};

// n items `stride` apart, each `item` long: (n − 1)·stride + item; 0 for n = 0 and `item` for n = 1 (the
// stride of a single item is never used).
constexpr CheckedSize strided(CheckedSize n, CheckedSize stride, CheckedSize item) {
    if (n.too_large()) return n;
    if (n.value() == 0) return 0;
    if (n.value() == 1) return item;
    return CheckedSize(n.value() - 1) * stride + item;
}

// A buffer an entry point reads or writes: its name, its size, and how that size is computed.
struct BufferSize {
    const char* name;
    CheckedSize bytes;
    const char* how;  // e.g. "n_rows rows row_stride apart"
};

// Throws std::invalid_argument "<context()>: the size of <name> (<how>) overflows ..." for the first of
// `buffers` that is too large. context() builds the message's prefix, only on failure (no allocation on the
// way through).
template <class Context>
void check_buffer_sizes(std::initializer_list<BufferSize> buffers, Context&& context) {
    for (const BufferSize& b : buffers) {
        if (b.bytes.too_large()) {
            throw std::invalid_argument(std::string(context()) + ": the size of " + b.name + " (" + b.how +
                                        ") overflows: no buffer is that large (at most PTRDIFF_MAX bytes); nothing was "
                                        "read or written");
        }
    }
}

}  // namespace kvq::detail
