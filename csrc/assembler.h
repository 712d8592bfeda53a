/* Batch assembler: gather the tensors of the requests in a batch into one contiguous
 * buffer, and scatter a batched output back into per-request buffers. Called with the
 * GIL released; all sizes are checked by the caller before the copy starts. */
#ifndef TRITON_SHM_ASSEMBLER_H
#define TRITON_SHM_ASSEMBLER_H

#include <stddef.h>
#include <stdint.h>

/* Copies n source spans back to back into dst. */
void tsm_gather(uint8_t *dst, const uint8_t *const *srcs, const size_t *sizes, size_t n);

/* Copies consecutive spans of src into the n destinations. */
void tsm_scatter(const uint8_t *src, uint8_t *const *dsts, const size_t *sizes, size_t n);

#endif
