/* An open-addressing set of non-NULL addresses (linear probing) for graph traversal:
 * a Python set of ints would allocate an int object per address, and graphs are built
 * in hot loops. Header-only; the first 16 slots live inside the struct, so small graphs
 * never allocate. */
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct pg_ptrset {
    uintptr_t * table;
    size_t cap, n;
    uintptr_t small[16];
} pg_ptrset;

static inline size_t pg_ptr_hash(uintptr_t key) {
    return (size_t) ((key >> 4) * (uintptr_t) 0x9E3779B97F4A7C15ull);
}

static inline void pg_ptrset_free(pg_ptrset * s) {
    if (s->table != s->small) {
        free(s->table);
    }
    s->table = NULL;
    s->cap = s->n = 0;
}

static inline int pg_ptrset_insert_new(pg_ptrset * s, uintptr_t key);

/* 0, or -1 when out of memory (the set is unchanged) */
static inline int pg_ptrset_resize(pg_ptrset * s, size_t cap) {
    uintptr_t * old = s->table;
    size_t old_cap = s->cap;
    uintptr_t * fresh;
    if (old == NULL && cap <= 16) {
        fresh = s->small;
        memset(fresh, 0, cap * sizeof(uintptr_t));
    } else {
        fresh = calloc(cap, sizeof(uintptr_t));
        if (fresh == NULL) {
            return -1;
        }
    }
    s->table = fresh;
    s->cap = cap;
    s->n = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i]) {
            pg_ptrset_insert_new(s, old[i]);
        }
    }
    if (old != NULL && old != s->small) {
        free(old);
    }
    return 0;
}

static inline int pg_ptrset_insert_new(pg_ptrset * s, uintptr_t key) {
    size_t mask = s->cap - 1, i = pg_ptr_hash(key) & mask;
    while (s->table[i]) {
        if (s->table[i] == key) {
            return 0;
        }
        i = (i + 1) & mask;
    }
    s->table[i] = key;
    s->n++;
    return 1;
}

/* 1 if key is in the set */
static inline int pg_ptrset_contains(const pg_ptrset * s, uintptr_t key) {
    if (s->cap == 0) {
        return 0;
    }
    size_t mask = s->cap - 1, i = pg_ptr_hash(key) & mask;
    while (s->table[i]) {
        if (s->table[i] == key) {
            return 1;
        }
        i = (i + 1) & mask;
    }
    return 0;
}

/* 1 if key was new (now in the set), 0 if it was there, -1 when out of memory */
static inline int pg_ptrset_add(pg_ptrset * s, uintptr_t key) {
    if ((s->n + 1) * 2 > s->cap && pg_ptrset_resize(s, s->cap == 0 ? 16 : s->cap * 2) != 0) {
        return -1;
    }
    return pg_ptrset_insert_new(s, key);
}

/* remove key if present (backward-shift deletion keeps probe chains intact) */
static inline void pg_ptrset_discard(pg_ptrset * s, uintptr_t key) {
    if (s->cap == 0) {
        return;
    }
    size_t mask = s->cap - 1, i = pg_ptr_hash(key) & mask, j, k;
    while (s->table[i] != key) {
        if (!s->table[i]) {
            return;
        }
        i = (i + 1) & mask;
    }
    s->table[i] = 0;
    s->n--;
    j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!s->table[j]) {
            return;
        }
        k = pg_ptr_hash(s->table[j]) & mask;
        /* move table[j] back to i unless its home k lies cyclically in (i, j] */
        if ((i < j && (k <= i || k > j)) || (i > j && k <= i && k > j)) {
            s->table[i] = s->table[j];
            s->table[j] = 0;
            i = j;
        }
    }
}
