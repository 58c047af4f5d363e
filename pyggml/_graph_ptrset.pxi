# Included by _graph.pyx: an open-addressing set of tensor addresses.

from libc.stdlib cimport calloc, free
from libc.string cimport memset

cdef inline size_t _ptr_hash(uintptr_t key) nogil:
    return <size_t>((key >> 4) * <uintptr_t>0x9E3779B97F4A7C15)


@cython.final
cdef class _PtrSet:
    """Open-addressing set of non-NULL addresses (linear probing), for graph traversal.

    A Python set of ints would allocate an int object per address; graphs are
    built in hot loops, so the traversal stays in C.
    """




    def __dealloc__(self):
        if self.table != self.small:
            free(self.table)

    cdef int _resize(self, size_t cap) except -1:
        cdef uintptr_t * old = self.table
        cdef size_t old_cap = self.cap, i
        cdef uintptr_t * new
        if old == NULL and cap <= 16:
            new = self.small
            memset(new, 0, cap * sizeof(uintptr_t))
        else:
            new = <uintptr_t *>calloc(cap, sizeof(uintptr_t))
        if new == NULL:
            raise MemoryError()
        self.table = new
        self.cap = cap
        self.n = 0
        for i in range(old_cap):
            if old[i]:
                self.add(old[i])
        if old != self.small:
            free(old)
        return 0

    cdef bint contains(self, uintptr_t key):
        if self.cap == 0:
            return False
        cdef size_t mask = self.cap - 1, i = _ptr_hash(key) & mask
        while self.table[i]:
            if self.table[i] == key:
                return True
            i = (i + 1) & mask
        return False

    cdef int add(self, uintptr_t key) except -1:
        """Insert ``key``; return 1 if it was new, 0 if present."""
        if (self.n + 1) * 2 > self.cap:
            self._resize(16 if self.cap == 0 else self.cap * 2)
        cdef size_t mask = self.cap - 1, i = _ptr_hash(key) & mask
        while self.table[i]:
            if self.table[i] == key:
                return 0
            i = (i + 1) & mask
        self.table[i] = key
        self.n += 1
        return 1

    cdef void discard(self, uintptr_t key):
        """Remove ``key`` if present (backward-shift deletion keeps probe chains intact)."""
        if self.cap == 0:
            return
        cdef size_t mask = self.cap - 1, i = _ptr_hash(key) & mask, j, k
        while self.table[i] != key:
            if not self.table[i]:
                return
            i = (i + 1) & mask
        self.table[i] = 0
        self.n -= 1
        j = i
        while True:
            j = (j + 1) & mask
            if not self.table[j]:
                return
            k = _ptr_hash(self.table[j]) & mask
            # move table[j] back to i unless its home k lies cyclically in (i, j]
            if (i < j and (k <= i or k > j)) or (i > j and k <= i and k > j):
                self.table[i] = self.table[j]
                self.table[j] = 0
                i = j


