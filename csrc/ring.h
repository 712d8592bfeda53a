/* A bounded single-producer single-consumer ring of records in shared memory.
 *
 * One ring per direction per worker, in a memfd both processes map. Layout:
 *
 *   0     u64 head      bytes the consumer has consumed (only it writes)
 *   64    u64 tail      bytes the producer has published (only it writes)
 *   128   u32 sleeping  1: the consumer is, or is about to be, asleep (on this word as a futex,
 *                       or on its eventfd: the link decides which, per direction)
 *   4096  data          capacity bytes, a power of two
 *
 * Positions grow without wrapping (u64); the index in data is pos & (capacity - 1).
 * A record is u32 length, u32 flags, the payload, padded to 8 bytes; it never straddles
 * the end: a record that would is preceded by a WRAP marker (length 0xFFFFFFFF) and
 * starts at index 0. The producer publishes with a release store of tail, the consumer
 * reads with an acquire load; the wake-up handshake (sleeping set, full fence, re-check;
 * publish, full fence, test sleeping) means a wake is skipped only while the consumer is
 * awake, and never lost.
 *
 * The peer is not trusted: a consumer checks every position and length against the
 * ring and reports TSM_RING_CORRUPT instead of reading outside it.
 */
#ifndef TSM_RING_H
#define TSM_RING_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>

#define TSM_RING_HEADER 4096u
#define TSM_RING_WRAP 0xFFFFFFFFu
#define TSM_RING_EMPTY 0
#define TSM_RING_OK 1
#define TSM_RING_FULL (-1)
#define TSM_RING_CORRUPT (-2)
#define TSM_RING_TIMED_OUT 0  /* tsm_ring_sleep's results */
#define TSM_RING_WOKEN 1
#define TSM_RING_KICKED 2

typedef struct {
    uint8_t *base;      /* the mapping */
    uint64_t capacity;  /* data bytes, a power of two */
    uint64_t pos;       /* our own position (tail for the producer, head for the consumer):
                           the copy in shared memory is what the peer may have scribbled on */
    uint32_t kicked;    /* consumer: another thread of its own process asked it to wake (tsm_ring_kick) */
} tsm_ring;

static inline uint64_t *tsm_ring_head(const tsm_ring *r) { return (uint64_t *)(r->base); }
static inline uint64_t *tsm_ring_tail(const tsm_ring *r) { return (uint64_t *)(r->base + 64); }
static inline uint32_t *tsm_ring_sleeping(const tsm_ring *r) { return (uint32_t *)(r->base + 128); }
static inline uint8_t *tsm_ring_data(const tsm_ring *r) { return r->base + TSM_RING_HEADER; }
static inline uint64_t tsm_ring_pad(uint64_t n) { return (n + 7u) & ~(uint64_t)7u; }

/* Largest payload a record may carry: half the ring, so one always fits once drained. */
static inline uint64_t tsm_ring_max_record(const tsm_ring *r) { return r->capacity / 2 - 8; }

/* Producer: append one record. Returns TSM_RING_OK, or TSM_RING_FULL (nothing written).
 * *wake is set when the consumer sleeps and must be woken (tsm_ring_wake, or its eventfd). */
static inline int tsm_ring_push(tsm_ring *r, const uint8_t *data, uint32_t len, uint32_t flags, int *wake) {
    uint64_t tail = r->pos;
    uint64_t head = __atomic_load_n(tsm_ring_head(r), __ATOMIC_ACQUIRE);
    uint64_t need = 8 + tsm_ring_pad(len);
    uint64_t idx = tail & (r->capacity - 1);
    uint64_t room = r->capacity - idx;
    uint64_t total = room >= need ? need : room + need;
    uint8_t *d = tsm_ring_data(r);
    *wake = 0;
    if (len > tsm_ring_max_record(r) || tail - head > r->capacity || total > r->capacity - (tail - head))
        return TSM_RING_FULL;
    if (room < need) {
        uint32_t wrap = TSM_RING_WRAP;
        memcpy(d + idx, &wrap, 4);
        tail += room;
        idx = 0;
    }
    memcpy(d + idx, &len, 4);
    memcpy(d + idx + 4, &flags, 4);
    if (len)
        memcpy(d + idx + 8, data, len);
    r->pos = tail + need;
    __atomic_store_n(tsm_ring_tail(r), r->pos, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(tsm_ring_sleeping(r), __ATOMIC_RELAXED))
        *wake = __atomic_exchange_n(tsm_ring_sleeping(r), 0, __ATOMIC_SEQ_CST) != 0;
    return TSM_RING_OK;
}

/* Producer: bytes free for records (0 if the consumer's position makes no sense). */
static inline uint64_t tsm_ring_room(const tsm_ring *r) {
    uint64_t used = r->pos - __atomic_load_n(tsm_ring_head(r), __ATOMIC_ACQUIRE);
    return used > r->capacity ? 0 : r->capacity - used;
}

/* Consumer: the next record, in place. Returns TSM_RING_OK (*data, *len, *flags set; call
 * tsm_ring_consume(r, *next) once done with it), TSM_RING_EMPTY or TSM_RING_CORRUPT. */
static inline int tsm_ring_peek(tsm_ring *r, const uint8_t **data, uint32_t *len, uint32_t *flags,
                                uint64_t *next) {
    uint64_t head = r->pos;
    uint64_t tail = __atomic_load_n(tsm_ring_tail(r), __ATOMIC_ACQUIRE);
    uint8_t *d = tsm_ring_data(r);
    uint64_t idx, need;
    uint32_t n;
    if (tail == head)
        return TSM_RING_EMPTY;
    if (tail - head > r->capacity || tail - head < 8)
        return TSM_RING_CORRUPT;
    idx = head & (r->capacity - 1);
    memcpy(&n, d + idx, 4);
    if (n == TSM_RING_WRAP) {
        head += r->capacity - idx;
        if (tail - head < 8 || tail - head > r->capacity)
            return TSM_RING_CORRUPT;
        idx = 0;
        memcpy(&n, d, 4);
    }
    need = 8 + tsm_ring_pad(n);
    if (n > tsm_ring_max_record(r) || need > tail - head || idx + need > r->capacity)
        return TSM_RING_CORRUPT;
    memcpy(flags, d + idx + 4, 4);
    *data = d + idx + 8;
    *len = n;
    *next = head + need;
    return TSM_RING_OK;
}

static inline void tsm_ring_consume(tsm_ring *r, uint64_t next) {
    r->pos = next;
    __atomic_store_n(tsm_ring_head(r), next, __ATOMIC_RELEASE);
}

static inline int tsm_ring_pending(const tsm_ring *r) {
    return __atomic_load_n(tsm_ring_tail(r), __ATOMIC_ACQUIRE) != r->pos;
}

/* Consumer: about to block. Returns 1 if it may (nothing arrived meanwhile), 0 if a
 * record arrived and it must drain again instead. */
static inline int tsm_ring_prepare_sleep(tsm_ring *r) {
    __atomic_store_n(tsm_ring_sleeping(r), 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (tsm_ring_pending(r)) {
        __atomic_store_n(tsm_ring_sleeping(r), 0, __ATOMIC_RELAXED);
        return 0;
    }
    return 1;
}

static inline void tsm_ring_awake(tsm_ring *r) {
    __atomic_store_n(tsm_ring_sleeping(r), 0, __ATOMIC_RELAXED);
}

/* The futex on the sleeping word. Not FUTEX_PRIVATE_FLAG: the word is shared between processes. */
static inline long tsm_futex(uint32_t *word, int op, uint32_t value, const struct timespec *timeout) {
    return syscall(SYS_futex, word, op, value, timeout, NULL, 0);
}

/* Producer (or anyone): wake a consumer that sleeps in tsm_ring_sleep (tsm_ring_push says when one
 * does, and has cleared the sleeping word already; anyone else clears it here). */
static inline void tsm_ring_wake(tsm_ring *r) {
    __atomic_store_n(tsm_ring_sleeping(r), 0, __ATOMIC_SEQ_CST);
    tsm_futex(tsm_ring_sleeping(r), FUTEX_WAKE, INT_MAX, NULL);
}

/* Consumer: sleep on the sleeping word after tsm_ring_prepare_sleep returned 1 (call without the
 * GIL), until a push wakes it, tsm_ring_kick, or timeout_ns (0: no limit). Leaves it awake.
 * Returns TSM_RING_WOKEN (woken, or the word had changed already: look at the ring), TSM_RING_KICKED
 * or TSM_RING_TIMED_OUT. A wake-up is never lost: FUTEX_WAIT sleeps only while the word is still 1,
 * and a producer clears it before it wakes. */
static inline int tsm_ring_sleep(tsm_ring *r, uint64_t timeout_ns) {
    struct timespec ts = {(time_t)(timeout_ns / 1000000000u), (long)(timeout_ns % 1000000000u)};
    int result = TSM_RING_WOKEN;
    if (!__atomic_load_n(&r->kicked, __ATOMIC_SEQ_CST)) {  /* after prepare_sleep's store: see tsm_ring_kick */
        if (tsm_futex(tsm_ring_sleeping(r), FUTEX_WAIT, 1, timeout_ns ? &ts : NULL) < 0 && errno == ETIMEDOUT)
            result = TSM_RING_TIMED_OUT;
    }
    __atomic_store_n(tsm_ring_sleeping(r), 0, __ATOMIC_RELAXED);
    if (__atomic_exchange_n(&r->kicked, 0, __ATOMIC_SEQ_CST))
        result = TSM_RING_KICKED;
    return result;
}

/* Another thread of the consumer's process: wake the consumer's sleep (or make its next one return
 * at once). Either the consumer sees the flag after its prepare_sleep, or this sees its sleeping word
 * set, clears it and wakes it. */
static inline void tsm_ring_kick(tsm_ring *r) {
    __atomic_store_n(&r->kicked, 1, __ATOMIC_SEQ_CST);
    if (__atomic_exchange_n(tsm_ring_sleeping(r), 0, __ATOMIC_SEQ_CST))
        tsm_ring_wake(r);
}

/* Consumer: wait up to ns nanoseconds for a record without sleeping (call without the
 * GIL). Returns 1 if one is there. */
static inline int tsm_ring_spin(const tsm_ring *r, uint64_t ns) {
    struct timespec t0, t;
    uint64_t spent;
    unsigned i = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (tsm_ring_pending(r))
            return 1;
        if ((++i & 63) == 0) {
            sched_yield();  /* on a busy machine, whoever we wait for may need this CPU */
            clock_gettime(CLOCK_MONOTONIC, &t);
            spent = (uint64_t)(t.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)(t.tv_nsec - t0.tv_nsec);
            if (spent >= ns)
                return 0;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

#endif
