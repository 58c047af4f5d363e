/* AddressSanitizer hooks for context pools (scripts/sanitize.py builds with ASan).
 * A pool is poisoned except the bytes ggml's objects use: before every allocation
 * pyggml unpoisons exactly the bytes it measured the allocation will take and keeps the
 * rest of the pool poisoned, so a kernel writing past the last tensor of a pool (the
 * FLASH_ATTN_BACK batch+GQA overrun, say) is an ASan report, not silent damage.
 * Without ASan these are empty. (Padding between objects stays unpoisoned: ggml packs
 * objects, and a header follows each tensor's padded data.)
 * `*end` is where the addressable part of the pool ends (all of it is poisoned past it):
 * a reservation poisons only what the previous one left addressable past its own end,
 * not the whole rest of the pool. Poisoning the rest each time wrote a pool's shadow
 * (1/8 of it) at every op: 1.2 ms an op for a 113 MB pool. */
#pragma once
#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#  define PYGGML_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define PYGGML_ASAN 1
#  endif
#endif

#ifdef PYGGML_ASAN
#include <sanitizer/asan_interface.h>
static inline void pg_asan_reserve(void * pool, size_t used, size_t need, size_t size, size_t * end) {
    char * p = (char *) pool;
    if (used + need > size) {
        return;
    }
    ASAN_UNPOISON_MEMORY_REGION(p + used, need);
    if (*end > used + need) {
        ASAN_POISON_MEMORY_REGION(p + used + need, *end - used - need);
    }
    *end = used + need;
}
static inline void pg_asan_release(void * pool, size_t size) {
    ASAN_UNPOISON_MEMORY_REGION(pool, size);
}
static inline int pg_asan_enabled(void) { return 1; }
#else
static inline void pg_asan_reserve(void * pool, size_t used, size_t need, size_t size, size_t * end) {
    (void) pool; (void) used; (void) need; (void) size; (void) end;
}
static inline void pg_asan_release(void * pool, size_t size) { (void) pool; (void) size; }
static inline int pg_asan_enabled(void) { return 0; }
#endif
