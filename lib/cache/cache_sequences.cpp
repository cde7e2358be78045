// Sequence lifetime: fork (blocks shared by reference count), truncate and remove (blocks return to the
// pool). None of these needs a new block; a fork copies the parent's float staging and block tables, which
// count against the pool (PoolExhausted if they do not fit, nothing changed).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cache_impl.hpp"

namespace kvq {

SequenceId detail::CacheImpl::fork(SequenceId parent) {
    std::vector<std::shared_ptr<detail::Sequence>> fresh{std::make_shared<detail::Sequence>()};
    detail::Sequence& child = *fresh[0];
    std::vector<detail::BlockRef> shared;
    size_t staging_added = 0, units = 0;
    {
        // Copying the parent (its tables, its float staging) may throw; it changes nothing.
        const ReadHeld p = read("fork", parent);
        child.layers = p->layers;
        for (size_t l = 0; l < child.layers.size(); ++l) {
            const auto& st = child.layers[l];
            shared.insert(shared.end(), st.table.begin(), st.table.end());
            staging_added += st.staging.empty() ? 0 : staging_layer_bytes;  // the reservation, not what is held
            units += st.staging.empty() ? 0 : kind(static_cast<int>(l)).staging_units;
        }
        // The copy's bookkeeping: its state and its copies of the parent's block tables.
        child.charged = sequence_metadata_bytes() + shared.size() * kTableEntryBytes;
        pool->take({}, units, staging_added, {}, false, child.charged);  // both or neither
        // Under the parent's lock: a writer of the parent may release these blocks once it has it.
        pool->retain(shared);
    }
    // Published complete: its blocks retained and its bytes counted.
    staging_bytes += staging_added;
    try {
        return publish(fresh)[0];
    } catch (...) {
        staging_bytes -= staging_added;
        pool->release(shared);
        pool->unreserve(units, staging_added);
        pool->uncharge_bookkeeping(child.charged);
        throw;
    }
}

void detail::CacheImpl::remove(SequenceId id) {
    std::shared_ptr<detail::Sequence> seq;
    {
        std::lock_guard<std::mutex> lock(seq_mu);
        const auto it = seqs.find(id);
        if (it == seqs.end()) {
            throw UnknownSequence("KVCache::remove: no sequence with id " + std::to_string(id));
        }
        seq = std::move(it->second);
        seqs.erase(it);
    }
    // Unpublished: no call can find it any more. Calls that found it before hold it or wait for its lock;
    // once this call holds it alone, those that still wait see it removed.
    std::unique_lock<std::shared_mutex> alone(seq->mu);
    seq->removed = true;
    for (size_t l = 0; l < seq->layers.size(); ++l) {
        auto& st = seq->layers[l];
        pool->release(st.table);
        if (!st.staging.empty()) {
            staging_bytes -= staging_layer_bytes;
            pool->unreserve(kind(static_cast<int>(l)).staging_units, staging_layer_bytes);
        }
    }
    seq->layers.clear();
    metadata_bytes -= seq->charged;
    pool->uncharge_bookkeeping(seq->charged);
}

void detail::CacheImpl::uncharge_entries(detail::Sequence& seq, size_t entries) {
    const size_t bytes = std::min(seq.charged, entries * kTableEntryBytes);
    seq.charged -= bytes;
    metadata_bytes -= bytes;
    pool->uncharge_bookkeeping(bytes);
}

void detail::CacheImpl::truncate(SequenceId id, size_t n) {
    const WriteHeld held = write("truncate", id);
    detail::Sequence& seq = *held.seq;
    size_t longest = 0;
    for (const auto& st : seq.layers) longest = std::max(longest, st.n_tokens);
    if (n > longest) {
        throw std::invalid_argument("KVCache::truncate: cannot keep " + std::to_string(n) + " tokens of sequence " +
                                    std::to_string(id) + ", which holds " + std::to_string(longest));
    }
    // A windowed layer must still hold every token its window needs after the truncation.
    for (size_t l = 0; l < seq.layers.size(); ++l) {
        const auto& st = seq.layers[l];
        const size_t w = window(static_cast<int>(l));
        const size_t needed_from = w && n > w ? n - w : 0;
        if (st.n_tokens > n && st.first_pos > needed_from) {
            throw std::invalid_argument(
                "KVCache::truncate: layer " + std::to_string(l) + " (sliding window of " + std::to_string(w) +
                " tokens) has released the tokens before position " + std::to_string(st.first_pos) +
                "; truncating to " + std::to_string(n) + " tokens would need them from position " +
                std::to_string(needed_from) + "; nothing was changed");
        }
    }
    const size_t bt = this->bt();
    for (auto& st : seq.layers) {
        if (st.n_tokens <= n) continue;
        if (n >= st.pool_end()) {
            st.staged = n - st.pool_end();
        } else {
            const size_t keep = n > st.first_pos ? (n - st.first_pos + bt - 1) / bt : 0;
            pool->release(std::span<const detail::BlockRef>(st.table).subspan(keep));
            uncharge_entries(seq, st.table.size() - keep);
            st.table.resize(keep);
            st.data.resize(keep);
            st.staged = 0;
        }
        st.n_tokens = n;
        std::erase_if(st.poisoned, [&](const auto& p) { return p.first >= n; });
    }
}

}  // namespace kvq
