/* Batch assembler: gather the tensors of the requests in a batch into one contiguous
 * buffer, and scatter a batched output back into per-request buffers. Called with the
 * GIL released; all sizes are checked by the caller before the copy starts.
 *
 * Copies are guarded against SIGBUS: a client may truncate its shared-memory region
 * while the worker reads or writes it, which faults on the mapping. With the guard
 * installed, such a fault makes the copy return -1 instead of killing the process. */
#ifndef TRITON_SHM_ASSEMBLER_H
#define TRITON_SHM_ASSEMBLER_H

#include <stddef.h>
#include <stdint.h>

/* Installs the process-wide SIGBUS handler (idempotent). A SIGBUS outside a guarded
 * copy and a watched mapping is re-raised with the previous disposition, so other faults behave as before. */
int tsm_install_sigbus_guard(void);

/* Watches a mapping of a client region that models read in place (outside any guarded
 * copy): a SIGBUS inside it puts zero pages over the whole mapping and marks it poisoned
 * instead of killing the process. Returns the slot, or -1 when the table is full. The
 * caller unwatches the slot before it unmaps the range. */
int tsm_watch(void *start, size_t length);
void tsm_unwatch(int slot);
/* 1 once a fault has replaced the slot's mapping with zero pages. */
int tsm_poisoned(int slot);

/* memcpy that returns -1 instead of dying when the source or destination faults. */
int tsm_guarded_copy(uint8_t *dst, const uint8_t *src, size_t n);

/* Copies n source spans back to back into dst; -1 on a fault. */
int tsm_gather(uint8_t *dst, const uint8_t *const *srcs, const size_t *sizes, size_t n);

/* Copies consecutive spans of src into the n destinations; -1 on a fault. */
int tsm_scatter(const uint8_t *src, uint8_t *const *dsts, const size_t *sizes, size_t n);

#endif
