/* lp_safetensors.h — safetensors files in and out, with no model
 * knowledge: names and shapes in, float32 tensors out.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 * (an object: tensor name -> {"dtype", "shape", "data_offsets": [begin,
 * end]} relative to the data section, and an optional "__metadata__"
 * object of strings), then the data section, which the tensors cover
 * exactly, without overlap.
 *
 * Reading opens the file and checks the whole header against the format's
 * rules before any allocation that the file's data controls (header
 * length within the file, every dtype known, shape x dtype size = byte
 * length, offsets inside the data section, no overlap, no gap). A tensor
 * is then read by name with positioned reads (pread) of its own bytes
 * only, converted to float32 (the training dtype) in the caller's buffer
 * as it arrives: memory at read time is the one tensor, plus the block
 * scales of an FP8 weight. Every byte read is counted per file
 * (lp_safetensors_bytes_read), so a test can prove a rank read only its
 * share. Writing takes names, shapes and float32 data and writes F32 or
 * BF16 through a temporary that is renamed over the path on success.
 *
 * Errors: a status, and one line naming the file and, where there is one,
 * the tensor ("m.safetensors: tensor 'w': shape [2, 3] of F32 needs 24
 * bytes, data_offsets [0, 20] hold 20"); lp_safetensors_last_error for an
 * open file, the caller's err buffer (LP_ERRLEN) otherwise.
 *
 * Uses lp_base and lp_tensor (yajl underneath; yajl's own parse buffers
 * do not go through the allocation hooks). No Lua. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lp_base.h"
#include "lp_tensor.h"

/* The format's dtypes. The float ones convert to float32; the integer
 * and bool ones are listed and checked but not read (LP_ERR_UNSUPPORTED). */
typedef enum lp_safetensors_dtype {
  LP_SAFETENSORS_F32 = 0,
  LP_SAFETENSORS_F16,
  LP_SAFETENSORS_BF16,
  LP_SAFETENSORS_F8_E4M3, /* e4m3fn: no infinities, S.1111.111 is NaN */
  LP_SAFETENSORS_F8_E5M2,
  LP_SAFETENSORS_F64,
  LP_SAFETENSORS_BOOL,
  LP_SAFETENSORS_U8,
  LP_SAFETENSORS_I8,
  LP_SAFETENSORS_I16,
  LP_SAFETENSORS_U16,
  LP_SAFETENSORS_I32,
  LP_SAFETENSORS_U32,
  LP_SAFETENSORS_I64,
  LP_SAFETENSORS_U64,
  LP_SAFETENSORS_NDTYPE
} lp_safetensors_dtype;

/* The format's name of a dtype ("BF16"); "?" out of range. */
const char *lp_safetensors_dtype_name(lp_safetensors_dtype d);
/* Bytes per element (1 for BOOL and the FP8 types). */
size_t lp_safetensors_dtype_size(lp_safetensors_dtype d);
/* The dtype named s ("F8_E4M3"): LP_OK, or LP_ERR_ARG when unknown. */
lp_status lp_safetensors_dtype_parse(const char *s, lp_safetensors_dtype *out);

#define LP_SAFETENSORS_MAXDIM 8
#define LP_SAFETENSORS_BLOCK 128 /* DeepSeek's FP8 weight block */

/* One tensor of an open file. */
typedef struct lp_safetensors_info {
  const char *name; /* owned by the file */
  lp_safetensors_dtype dtype;
  int ndim;         /* 0 (a scalar) .. LP_SAFETENSORS_MAXDIM */
  int64_t shape[LP_SAFETENSORS_MAXDIM];
  int64_t numel;    /* product of shape (1 for a scalar) */
  uint64_t begin;   /* data_offsets, relative to the data section */
  uint64_t end;
} lp_safetensors_info;

/* An open file. One thread at a time per file (its counter and error
 * text are not shared safely); different files are independent. */
typedef struct lp_safetensors_file lp_safetensors_file;

/* Opens path and reads and checks its header (only the header: no tensor
 * byte is read). LP_OK and *out; or *out = NULL and LP_ERR_IO (cannot
 * open, a folder or not a regular file), LP_ERR_PARSE (the file breaks the format: truncated, header
 * length beyond the file, header not JSON or not the format's object,
 * unknown dtype, shape / offsets disagreeing, offsets out of range,
 * overlapping or leaving a gap, a name twice), LP_ERR_NOMEM, with one line
 * in err (LP_ERRLEN) naming path and the tensor. */
lp_status lp_safetensors_open(const char *path, lp_safetensors_file **out, char *err);
/* Closes the file and frees everything (NULL is a no-op). */
void lp_safetensors_close(lp_safetensors_file *f);
/* The last failure of a read on f (one line; "" when none). */
const char *lp_safetensors_last_error(const lp_safetensors_file *f);
/* The path given to open. */
const char *lp_safetensors_path(const lp_safetensors_file *f);

/* Tensors in the order of their data (data_offsets ascending), i in
 * 0..count-1. */
size_t lp_safetensors_count(const lp_safetensors_file *f);
const lp_safetensors_info *lp_safetensors_at(const lp_safetensors_file *f, size_t i);
/* The tensor called name, NULL when the file has none. */
const lp_safetensors_info *lp_safetensors_find(const lp_safetensors_file *f, const char *name);
/* "__metadata__": its pairs in the header's order, i in 0..n-1; the value
 * of key (NULL when absent). */
size_t lp_safetensors_metadata_count(const lp_safetensors_file *f);
void lp_safetensors_metadata_at(const lp_safetensors_file *f, size_t i, const char **key,
                                const char **value);
const char *lp_safetensors_metadata(const lp_safetensors_file *f, const char *key);
/* Bytes read from the file so far: the 8-byte length and the header at
 * open, then each tensor's bytes (and its scale's) per read. */
uint64_t lp_safetensors_bytes_read(const lp_safetensors_file *f);
/* Size of the file at open; offset of the data section (8 + N). */
uint64_t lp_safetensors_file_size(const lp_safetensors_file *f);
uint64_t lp_safetensors_data_offset(const lp_safetensors_file *f);

/* How to read one tensor. Zeroed: no scale. */
typedef struct lp_safetensors_read_opts {
  /* Block-scaled weights (DeepSeek's FP8): the name of the scale tensor,
   * whose shape must be [ceil(rows / block), ceil(cols / block)] for a
   * [rows, cols] weight; w[r, c] = q[r, c] * s[r / block, c / block].
   * DeepSeek's converted files call it "<name minus .weight>.scale",
   * Hugging Face's "<name>_scale_inv": the caller says which. NULL: none. */
  const char *scale;
  int64_t block; /* block edge, from quantization_config.weight_block_size;
                    0: LP_SAFETENSORS_BLOCK */
  /* The file that holds the scale when it is another shard (Hugging Face's
   * shards may cut between a weight and its scale); NULL: the same file.
   * The scale's bytes count in that file's bytes_read. */
  lp_safetensors_file *scale_file;
} lp_safetensors_read_opts;

/* Reads tensor `name` converted to float32 into dst, which holds n floats
 * (n must equal its numel). opts may be NULL. Memory beyond dst: the scale
 * tensor, when one is asked for. LP_ERR_ARG (no such tensor, n wrong, a
 * scale that is missing or has the wrong block shape, a weight that is
 * not 2-D with a scale), LP_ERR_UNSUPPORTED (an integer dtype), LP_ERR_IO
 * (the read failed or came short: the file shrank), LP_ERR_NOMEM; text in
 * lp_safetensors_last_error. dst's contents are unspecified on failure. */
lp_status lp_safetensors_read(lp_safetensors_file *f, const char *name,
                              const lp_safetensors_read_opts *opts, float *dst, int64_t n);
/* The same into a new dense CPU lp_tensor (*out; NULL on failure); a
 * scalar becomes shape [1]. LP_ERR_UNSUPPORTED for more than
 * LP_TENSOR_MAXDIM dims. */
lp_status lp_safetensors_read_tensor(lp_safetensors_file *f, const char *name,
                                     const lp_safetensors_read_opts *opts, lp_tensor **out);

/* ---- writing --------------------------------------------------------- */

/* One tensor to write: data holds numel(shape) floats (may be NULL when
 * that is 0). */
typedef struct lp_safetensors_entry {
  const char *name;
  int ndim; /* 0 .. LP_SAFETENSORS_MAXDIM */
  const int64_t *shape;
  const float *data;
} lp_safetensors_entry;

typedef struct lp_safetensors_write_opts {
  lp_safetensors_dtype dtype; /* LP_SAFETENSORS_F32 (exact) or _BF16
                                 (rounded to nearest even; NaN -> 0x7FC0) */
  int keep_order;             /* 0: tensors sorted by name (bytewise);
                                 1: in the order given */
  const char *const *metadata; /* key, value, key, value, ... : "__metadata__" */
  size_t n_metadata;           /* pairs */
} lp_safetensors_write_opts;

/* Writes n tensors to path: header (no spaces, padded with spaces so the
 * data starts at a multiple of 8), then the data in header order. The file
 * appears whole or not at all (a temporary renamed over path). LP_ERR_ARG
 * (an empty or repeated name, "__metadata__" as a tensor name, a bad
 * shape, data NULL, a dtype other than F32 / BF16, a repeated metadata
 * key), LP_ERR_IO, LP_ERR_NOMEM, with one line in err. opts may be NULL
 * (F32, sorted). */
lp_status lp_safetensors_write(const char *path, const lp_safetensors_entry *t, size_t n,
                               const lp_safetensors_write_opts *opts, char *err);

/* ---- conversions (exposed for tests and the bench) ------------------- */
uint16_t lp_safetensors_f32_to_bf16(float x); /* round to nearest even */
float lp_safetensors_bf16_to_f32(uint16_t h);
float lp_safetensors_f16_to_f32(uint16_t h);
float lp_safetensors_e4m3_to_f32(uint8_t b);
