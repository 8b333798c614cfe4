/*
 * The interface a ckptfs mount shows to programs: the names of its extended
 * attributes, its reserved file names and the checkpoint states. The daemon
 * (fs/) and the ckpt tools use these and nothing else to talk to each other,
 * so `ckpt commit` and `ckpt status` work with nothing but a path. This is
 * their one home; any program may rely on them (ckptfs(8) documents them).
 *
 * A mount shows one directory per checkpoint:
 *
 *   MOUNT/NAME/                   a checkpoint (writing reopens it once packed)
 *   MOUNT/NAME/manifest.json      every file and tensor, with offsets (JSON)
 *   MOUNT/NAME/tensors/<name>     each tensor's raw bytes, one file per tensor
 *   MOUNT/NAME/.packed/...        packed files whose names clash with the two
 *                                 above ("manifest.json" -> ".packed/manifest.json")
 *   MOUNT/NAME/<path>             every other packed file at its packed path
 */
#ifndef CKPT_MOUNT_H
#define CKPT_MOUNT_H

/* ------------------------------------------------------ reserved names */

/* Top-level names of a checkpoint directory that belong to ckptfs; a packed
 * file whose first component is one of them is shown under .packed/. */
#define CKPT_MOUNT_MANIFEST "manifest.json"
#define CKPT_MOUNT_TENSORS_DIR "tensors"
#define CKPT_MOUNT_PACKED_DIR ".packed"

/* ----------------------------------------------------- extended attributes */

/* Every attribute ckptfs defines starts with this; setting any other name
 * under it is refused (EPERM) in a writable checkpoint. */
#define CKPT_XATTR_PREFIX "user.ckptfs."

/* On each tensor file under tensors/ (read-only). */
#define CKPT_XATTR_DTYPE "user.ckptfs.dtype"   /* safetensors dtype name: "BF16" */
#define CKPT_XATTR_SHAPE "user.ckptfs.shape"   /* "[768, 3072]" */
#define CKPT_XATTR_SHA256 "user.ckptfs.sha256" /* 64 lower-case hex digits */

/* On each checkpoint directory (read-only). */
#define CKPT_XATTR_STATE "user.ckptfs.state"       /* one of the CKPT_STATE_* below */
#define CKPT_XATTR_PROGRESS "user.ckptfs.progress" /* "DONE TOTAL SECONDS": packing */
#define CKPT_XATTR_SIZE "user.ckptfs.size"         /* staged bytes, in decimal */
#define CKPT_XATTR_ERROR                                                                           \
    "user.ckptfs.error" /* the last error: why packing failed
                                                    * (failed), why the pack cannot be
                                                    * read (key mismatch, damaged), or
                                                    * the last read fault of a pack */
/* The absolute path of the pack a committed checkpoint is read from
 * (BACKING/NAME.tpack), so that tools given MOUNT/NAME (`ckpt ls`,
 * `ckpt verify`, `ckpt cat`) open the pack itself. Absent while the
 * checkpoint is being written. */
#define CKPT_XATTR_PACK "user.ckptfs.pack"

/* Written (any value) on a writable checkpoint directory to pack it: the
 * checkpoint's name then leads to the pack once packing succeeds. */
#define CKPT_XATTR_COMMIT "user.ckptfs.commit"

/* --------------------------------------------------- checkpoint states */

/* Values of CKPT_XATTR_STATE. A writable checkpoint goes writing -> packing
 * -> committed, or -> failed (the staged data stays and a commit retries);
 * deleted is seen only through a handle opened before it was removed.
 * A pack that cannot be read shows instead of committed as key mismatch
 * (encrypted with another key than the mount's, or the mount has none:
 * reads fail with EACCES) or damaged (empty, not a pack, a damaged header
 * or index: reads fail with EIO); CKPT_XATTR_ERROR says why. While its
 * store does not answer (an S3 gateway down: reads of what is not cached
 * fail with EIO, at once after the first has waited out the retries) it
 * shows as unreachable, and as committed again once the store answers. */
#define CKPT_STATE_WRITING "writing"
#define CKPT_STATE_PACKING "packing"
#define CKPT_STATE_COMMITTED "committed"
#define CKPT_STATE_FAILED "failed"
#define CKPT_STATE_DELETED "deleted"
#define CKPT_STATE_KEY_MISMATCH "key mismatch"
#define CKPT_STATE_DAMAGED "damaged"
#define CKPT_STATE_UNREACHABLE "unreachable"

#endif
