//! Every unsafe call of the NCCL transport, behind types that make them sound.
//!
//! NCCL reads and writes raw device pointers on a stream, long after the call returns. Three
//! things must hold for that to be safe, and each is a type here rather than a comment at a
//! call site:
//!
//! - a pointer is cubecl's own resource for a live tensor, and the payload fits in it:
//!   [`Buffer`] holds the tensor and the resource, and [`Communicator::group`] checks the
//!   size against the resource;
//! - the memory lives until NCCL is done with it: [`InFlight`] owns the buffer and, when
//!   dropped before its transfer completed, waits for it (or, when the transfer never ends
//!   because a peer died, leaks the buffer rather than hand it back to the allocator);
//! - one communicator is not called from two threads at once: the transport holds it in a
//!   mutex, and [`Communicator`] is `Send` but not `Sync`.

use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use cudarc::nccl::{result, sys};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// NCCL's unique id, as bytes: rank 0 makes it, every rank joins with it.
pub(crate) type UniqueId = [u8; 128];

/// A new unique id (rank 0 only).
pub(crate) fn unique_id() -> Result<UniqueId, String> {
    let id = result::get_uniqueid().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
    Ok(id.internal.map(|c| c as u8))
}

/// A tensor's device memory, held while NCCL may touch it.
pub(crate) struct Buffer {
    tensor: CubeTensor<CudaRuntime>,
    ptr: u64,
    capacity: u64,
    /// cubecl's resource binding: keeps the allocation bound for as long as NCCL uses it.
    _resource: Box<dyn Send>,
}

impl Buffer {
    /// The memory of `tensor`, whose elements must lie contiguously from its handle's start.
    pub(crate) fn of(tensor: CubeTensor<CudaRuntime>) -> Result<Self, String> {
        if !tensor.is_contiguous() {
            return Err("NCCL moves contiguous tensors only".into());
        }
        let resource = tensor
            .client
            .get_resource(tensor.handle.clone())
            .map_err(|e| format!("cubecl get_resource: {e:?}"))?;
        let (ptr, capacity) = (resource.resource().ptr, resource.resource().size);
        Ok(Self {
            tensor,
            ptr,
            capacity,
            _resource: Box::new(resource),
        })
    }

    /// The payload's size in bytes.
    fn bytes(&self) -> u64 {
        (self.tensor.meta.shape().num_elements() * self.tensor.dtype.size()) as u64
    }
}

/// Which way a buffer's bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// From this rank to `peer`.
    Send,
    /// From `peer` into this rank's buffer.
    Recv,
}

/// One transfer of a group.
pub(crate) struct Op {
    /// Send or receive.
    pub direction: Direction,
    /// The other rank.
    pub peer: usize,
    /// The memory read or written.
    pub buffer: Buffer,
}

/// A transfer NCCL has been given: its buffer, until the group's event says it is done.
pub(crate) struct InFlight {
    done: Arc<CudaEvent>,
    buffer: Option<Buffer>,
}

/// The transfer did not complete in time; its buffer stays held (see [`InFlight`]'s drop).
#[derive(Debug)]
pub(crate) struct Unfinished(pub String);

impl InFlight {
    /// Waits until the transfer completed, or until `deadline`; returns its tensor.
    pub(crate) fn wait(mut self, deadline: Instant) -> Result<CubeTensor<CudaRuntime>, Unfinished> {
        let mut spins = 0u32;
        loop {
            match self.done.try_is_complete() {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => return Err(Unfinished(format!("CUDA event query: {e:?}"))),
            }
            if Instant::now() >= deadline {
                return Err(Unfinished("the transfer did not complete in time".into()));
            }
            // Short transfers end within microseconds: yield first, then sleep.
            spins += 1;
            if spins < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let buffer = self.buffer.take().expect("taken once");
        Ok(buffer.tensor)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(buffer) = self.buffer.take() else {
            return;
        };
        // A transfer given up on (an error elsewhere) may still be writing: wait for it a
        // while. One that never ends (a peer died; the communicator was not aborted) keeps its
        // memory for ever, so that no tensor is ever allocated where NCCL may still write.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(true) = self.done.try_is_complete() {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        tracing::warn!("rtp: an NCCL transfer never completed; its buffer is leaked");
        std::mem::forget(buffer);
    }
}

/// An NCCL communicator with the CUDA stream its transfers run on.
pub(crate) struct Communicator {
    comm: sys::ncclComm_t,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time (the transport
// keeps it in a mutex; the type is not `Sync`). The context is bound to the calling thread
// before every call.
unsafe impl Send for Communicator {}

impl Communicator {
    /// Joins the communicator of `size` ranks named by `id`, as `rank`, on the GPU `ordinal`,
    /// with a stream of its own. Blocks until every rank has joined.
    pub(crate) fn join(
        ordinal: usize,
        rank: usize,
        size: usize,
        id: UniqueId,
    ) -> Result<Self, String> {
        let ctx =
            CudaContext::new(ordinal).map_err(|e| format!("CUDA context {ordinal}: {e:?}"))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| format!("CUDA stream: {e:?}"))?;
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let (Ok(n), Ok(r)) = (i32::try_from(size), i32::try_from(rank)) else {
            return Err(format!("{size} ranks exceed NCCL's range"));
        };
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is written by NCCL before `assume_init`, which only runs on success;
        // the context of `ordinal` is current on this thread (`CudaContext::new` binds it).
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), n, id, r)
                .map_err(|e| format!("ncclCommInitRank: {e:?}"))?;
            comm.assume_init()
        };
        Ok(Self { comm, ctx, stream })
    }

    /// Issues `ops` as one NCCL group on the communicator's stream, and returns one
    /// [`InFlight`] per op, in order. The caller made sure that the compute stream is done
    /// with every buffer (a receive buffer's memory may have been another tensor's).
    pub(crate) fn group(&mut self, ops: Vec<Op>) -> Result<Vec<InFlight>, String> {
        for op in &ops {
            if op.buffer.bytes() > op.buffer.capacity {
                return Err(format!(
                    "a payload of {} bytes does not fit its buffer of {}",
                    op.buffer.bytes(),
                    op.buffer.capacity
                ));
            }
            nccl_dtype(op.buffer.tensor.dtype)?;
            i32::try_from(op.peer).map_err(|_| format!("rank {} out of range", op.peer))?;
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| format!("CUDA context: {e:?}"))?;
        result::group_start().map_err(|e| format!("ncclGroupStart: {e:?}"))?;
        let mut failed = None;
        for op in &ops {
            let dtype = nccl_dtype(op.buffer.tensor.dtype).expect("checked above");
            let count = op.buffer.tensor.meta.shape().num_elements();
            let peer = op.peer as i32;
            let stream = self.stream.cu_stream() as sys::cudaStream_t;
            // SAFETY: `ptr` is cubecl's resource for the live tensor the op owns, and the
            // payload (`count` elements of `dtype`) fits in it (checked above); the op's
            // buffer moves into an `InFlight` that holds it until the group's event
            // completes; the communicator is valid and used by this thread only (`&mut`).
            let issued = unsafe {
                match op.direction {
                    Direction::Send => result::send(
                        op.buffer.ptr as *const _,
                        count,
                        dtype,
                        peer,
                        self.comm,
                        stream,
                    ),
                    Direction::Recv => result::recv(
                        op.buffer.ptr as *mut _,
                        count,
                        dtype,
                        peer,
                        self.comm,
                        stream,
                    ),
                }
            };
            if let Err(e) = issued {
                failed = Some(format!(
                    "ncclSend/ncclRecv to or from rank {}: {e:?}",
                    op.peer
                ));
                break;
            }
        }
        // The group is closed whatever happened inside it.
        let ended = result::group_end().map_err(|e| format!("ncclGroupEnd: {e:?}"));
        let done = self
            .stream
            .record_event(None)
            .map_err(|e| format!("CUDA event: {e:?}"));
        // Buffers NCCL may have been given are held until the event (if any) says done.
        let done = Arc::new(match done {
            Ok(done) => done,
            Err(e) => {
                // No event: nothing can tell when the transfers end, so none is handed back.
                ops.into_iter().for_each(|op| std::mem::forget(op.buffer));
                return Err(e);
            }
        });
        let in_flight = ops
            .into_iter()
            .map(|op| InFlight {
                done: done.clone(),
                buffer: Some(op.buffer),
            })
            .collect();
        match (failed, ended) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(_)) => Ok(in_flight),
        }
    }

    /// Stops every transfer in flight (a peer failed), so that nothing waits for it.
    pub(crate) fn abort(&mut self) {
        if self.comm.is_null() {
            return;
        }
        // SAFETY: the communicator is valid and not used after this (it is set to null).
        let _ = unsafe { result::comm_abort(self.comm) };
        self.comm = std::ptr::null_mut();
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Abort, not destroy: destroy waits for transfers that a dead peer never completes.
        self.abort();
    }
}

/// NCCL's code for a float type.
fn nccl_dtype(dtype: DType) -> Result<sys::ncclDataType_t, String> {
    Ok(match dtype {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        other => return Err(format!("NCCL is not asked to move {other:?}")),
    })
}
