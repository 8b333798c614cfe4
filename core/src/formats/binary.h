/* The binary container formats beside safetensors and npy: GGUF
 * (formats/gguf.c) and tensorizer (formats/tensorizer.c). Each is a
 * container_format as formats.h describes; these declarations can move
 * there once the formats join ckpt_container_formats.
 *
 * Both emit tensors with safetensors dtype names. GGUF's quantized tensors
 * become ingest_regions whose dtype is "GGML_" and the ggml type name
 * ("GGML_Q8_0", "GGML_Q4_K", ...), to be packed with element size 1.
 *
 * Not part of the public API. */
#ifndef CKPT_FORMATS_BINARY_H
#define CKPT_FORMATS_BINARY_H

#include "formats.h"

extern const container_format ckpt_format_gguf;
extern const container_format ckpt_format_tensorizer;

#endif
