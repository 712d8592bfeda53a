#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>

#include "assembler.h"

/* volatile: the compiler must not drop the stores around memcpy as dead */
static __thread sigjmp_buf *volatile guard_jump;   /* set while this thread is in a guarded copy */
static struct sigaction previous_bus;
static volatile sig_atomic_t guard_installed;

/* Mappings of client regions that models read in place. A slot is free while its start
 * is 0; the handler reads the table without a lock, so a slot's length is written before
 * its start is published, and its start cleared before the mapping is unmapped. */
#define WATCHED_SLOTS 1024
static struct {
    uintptr_t start;
    size_t length;
    volatile sig_atomic_t poisoned;
} watched[WATCHED_SLOTS];

/* The fault lies in a watched mapping: put zero pages over the whole of it (one mmap, a
 * plain system call) and let the faulting instruction run again on them. Readers then see
 * zeros instead of dying, and the worker fails every request that read the mapping. */
static int poison_watched(uintptr_t addr)
{
    for (int i = 0; i < WATCHED_SLOTS; i++) {
        uintptr_t start = __atomic_load_n(&watched[i].start, __ATOMIC_ACQUIRE);
        if (start == 0 || addr - start >= __atomic_load_n(&watched[i].length, __ATOMIC_ACQUIRE))
            continue;
        if (mmap((void *)start, watched[i].length, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
            return 0;
        watched[i].poisoned = 1;
        return 1;
    }
    return 0;
}

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    (void)context;
    if (guard_jump != NULL)
        siglongjmp(*guard_jump, 1);
    if (info != NULL && poison_watched((uintptr_t)info->si_addr))
        return;
    /* not ours: behave as if we were never here */
    sigaction(SIGBUS, &previous_bus, NULL);
    raise(sig);
}

int tsm_install_sigbus_guard(void)
{
    if (guard_installed)
        return 0;
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &previous_bus) != 0)
        return -1;
    guard_installed = 1;
    return 0;
}

int tsm_guarded_copy(uint8_t *dst, const uint8_t *src, size_t n)
{
    sigjmp_buf jump;
    if (n == 0)
        return 0;
    if (sigsetjmp(jump, 1) != 0) {
        guard_jump = NULL;
        return -1;
    }
    guard_jump = &jump;
    memcpy(dst, src, n);
    guard_jump = NULL;
    return 0;
}

int tsm_gather(uint8_t *dst, const uint8_t *const *srcs, const size_t *sizes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (tsm_guarded_copy(dst, srcs[i], sizes[i]) != 0)
            return -1;
        dst += sizes[i];
    }
    return 0;
}

int tsm_scatter(const uint8_t *src, uint8_t *const *dsts, const size_t *sizes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (tsm_guarded_copy(dsts[i], src, sizes[i]) != 0)
            return -1;
        src += sizes[i];
    }
    return 0;
}

int tsm_watch(void *start, size_t length)
{
    if (start == NULL || length == 0)
        return -1;
    for (int i = 0; i < WATCHED_SLOTS; i++) {
        uintptr_t expected = 0;
        /* claim the slot with a placeholder start; a free slot's length is 0, so no fault
         * address matches it until the real start is published */
        if (!__atomic_compare_exchange_n(&watched[i].start, &expected, (uintptr_t)1, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        watched[i].poisoned = 0;
        __atomic_store_n(&watched[i].length, length, __ATOMIC_RELEASE);
        __atomic_store_n(&watched[i].start, (uintptr_t)start, __ATOMIC_RELEASE);
        return i;
    }
    return -1;
}

void tsm_unwatch(int slot)
{
    if (slot < 0 || slot >= WATCHED_SLOTS)
        return;
    __atomic_store_n(&watched[slot].start, (uintptr_t)0, __ATOMIC_RELEASE);
    __atomic_store_n(&watched[slot].length, (size_t)0, __ATOMIC_RELEASE);
}

int tsm_poisoned(int slot)
{
    return slot >= 0 && slot < WATCHED_SLOTS && watched[slot].poisoned;
}
