/* torch.save archives (torch >= 1.6: a zip of <dir>/data.pkl, <dir>/data/<key>
 * storage records, <dir>/byteorder, <dir>/version) as a container_format.
 *
 * sniff(): a zip local header at offset 0 whose entry is <dir>/data.pkl,
 * which torch writes first; any file name or extension (.pt, .pth, .bin,
 * .ckpt, optimizer.pt, ...).
 *
 * describe(): reads <dir>/data.pkl with the restricted pickle reader
 * (formats/pickle.h: nothing is imported or called) and finds:
 *   - every persistent id ('storage', storage_type, key, location, numel),
 *     where storage_type names the dtype (torch.FloatStorage, ...) or is
 *     torch.storage.UntypedStorage and the dtype comes from the
 *     torch._utils._rebuild_tensor_v3 call that uses it. Each storage whose
 *     dtype is known and whose <dir>/data/<key> record is stored raw and of
 *     the right size becomes one ingest_region of that dtype;
 *   - tensors (torch._utils._rebuild_tensor, _v2, _v3, wrapped in
 *     _rebuild_parameter, _rebuild_parameter_with_state or
 *     torch._tensor._rebuild_from_type_v2) reached from the root through
 *     dicts, collections.OrderedDict, lists and tuples. Names are dotted as
 *     state_dict() gives them ("model.layer.weight"; list items and int keys
 *     by number: "optim.state.0.exp_avg"); a bare tensor at the root is
 *     named after the path without .pt/.pth/.bin. Each contiguous (C-order)
 *     tensor becomes one ingest_tensor over its storage's bytes; tensors
 *     that share a storage (tied weights) each get one, and may overlap.
 *     Tensors that cannot be presented (a non-contiguous view, a negated
 *     view, an unknown dtype, a repeated name, ...) are listed in
 *     out->skipped with why.
 * A big-endian archive (<dir>/byteorder "big") keeps its regions but
 * presents no tensor. Anything else in the pickle (other objects, unknown
 * globals) is inert data and is not understood; that is not an error.
 * A broken zip or pickle, a bad byteorder record, or one past the bounds
 * (TORCH_MAX_PICKLE, the pickle reader's limits, 262144 tensors) is -EINVAL
 * with "torch archive: ..." in msg; a valid zip that is not a torch
 * archive, or one with nothing to present, returns 1 (store opaque).
 *
 * The caller frees out->regions and out->skipped with the rest of the
 * layout (ingest_layout_free must know them). */
#ifndef CKPT_FORMATS_TORCH_H
#define CKPT_FORMATS_TORCH_H

#include "formats/formats.h"

/* data.pkl larger than this is refused (a 70B-parameter state_dict's is
 * well under 1 MiB; optimizer states a few MiB). */
#define TORCH_MAX_PICKLE (64u << 20)

extern const container_format ckpt_format_torch;

/* ---- for containers that embed torch.save archives (formats/dcp.c) ----
 * describe() of the archive that occupies [base, base + len) of src, as if
 * it were a file of its own named path; offsets in *out are absolute in
 * src (header_bytes too). Same returns and messages as describe(). A range
 * outside src is -EINVAL. */
int torch_describe_range(const ingest_source *src, uint64_t base, uint64_t len, const char *path,
                         ingest_layout *out, char *msg, size_t msg_len);

/* The safetensors dtype name of torch.<name> ("bfloat16" -> "BF16"), or
 * NULL when it has none. */
const char *torch_dtype_name(const char *name);

#endif
