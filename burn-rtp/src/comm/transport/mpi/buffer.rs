//! Buffers lent to MPI for the life of a request: every `unsafe` line of the MPI transport.
//!
//! rsmpi ties a request to the lifetime of the buffer it reads or writes. Requests here
//! outlive any stack frame (the communication thread tests them in a loop), so a request gets
//! a `'static` view of memory that an [`InFlight`] keeps alive beside it. The contract:
//!
//! * the view points into a heap allocation that the `InFlight`'s [`Owner`] holds; moving the
//!   owner moves its handle, not the allocation;
//! * the owner is handed back only by [`InFlight::test`], once MPI completed the request and
//!   no longer touches the memory, and nothing else reads or writes it before then;
//! * a receive's view is the only reference to its buffer; a send's view is read-only, and so
//!   is every other reader of the same memory (other sends of one `Arc<TensorData>`, and a
//!   borrowed tensor's own rank, which writes it only once no other handle shares it, as
//!   [`HostBytes`] requires).
//!
//! An `InFlight` whose request never completes must not be dropped (rsmpi panics, since the
//! memory might still be in use); the engine forgets it instead, and leaves MPI unfinalised.

use super::super::HostBytes;
use burn::tensor::{Bytes, TensorData};
use mpi::point_to_point::{Destination, Message};
use mpi::request::{Request, StaticScope};
use std::sync::Arc;

/// A receive buffer allocated as elements of the message's element size, so that its
/// allocation has the element type's alignment and Burn takes it as a tensor's data without
/// copying it.
pub(super) enum Elems {
    B1(Vec<u8>),
    B2(Vec<u16>),
    B4(Vec<u32>),
    B8(Vec<u64>),
}

impl Elems {
    /// Room for `len` bytes as elements of `size` bytes (any other size: bytes).
    pub(super) fn zeroed(size: usize, len: usize) -> Self {
        match size {
            2 => Self::B2(vec![0; len.div_ceil(2)]),
            4 => Self::B4(vec![0; len.div_ceil(4)]),
            8 => Self::B8(vec![0; len.div_ceil(8)]),
            _ => Self::B1(vec![0; len]),
        }
    }

    /// The allocation's bytes.
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Self::B1(v) => v,
            Self::B2(v) => bytemuck::cast_slice_mut(v),
            Self::B4(v) => bytemuck::cast_slice_mut(v),
            Self::B8(v) => bytemuck::cast_slice_mut(v),
        }
    }

    /// The buffer as a tensor's bytes, keeping its allocation (and so its alignment).
    pub(super) fn into_bytes(self) -> Bytes {
        match self {
            Self::B1(v) => Bytes::from_elems(v),
            Self::B2(v) => Bytes::from_elems(v),
            Self::B4(v) => Bytes::from_elems(v),
            Self::B8(v) => Bytes::from_elems(v),
        }
    }
}

/// What owns the memory of a request's buffer.
pub(super) enum Owner {
    /// Small messages: envelopes and abort notices.
    Bytes(Vec<u8>),
    /// A tensor's host copy, sent without copying it again (shared by every peer it goes to).
    Data(Arc<TensorData>),
    /// A tensor the sender still holds, read in place (`host_view.rs`).
    Borrowed(Arc<dyn HostBytes>),
    /// A receive buffer.
    Elems(Elems),
}

/// A request in flight with the buffer lent to it (see the module's contract).
pub(super) struct InFlight {
    request: Request<'static, [u8], StaticScope>,
    owner: Owner,
}

impl InFlight {
    /// Starts sending `owner`'s bytes to `to` under `tag`.
    pub(super) fn send(to: &impl Destination, tag: i32, owner: Owner) -> Self {
        let bytes: &[u8] = match &owner {
            Owner::Bytes(b) => b,
            Owner::Data(d) => d.as_bytes(),
            Owner::Borrowed(b) => b.bytes(),
            Owner::Elems(_) => unreachable!("receive buffers are lent through `receive`"),
        };
        // SAFETY: the bytes lie in a heap allocation that `owner` keeps alive and that moving
        // `owner` into the returned value does not move; the view is read only, by MPI, and
        // `owner` is handed back only once the request completed (the module's contract).
        let view: &'static [u8] = unsafe { &*std::ptr::from_ref(bytes) };
        let request = to.immediate_send_with_tag(StaticScope, view, tag);
        Self { request, owner }
    }

    /// Starts receiving the matched `message` into the first `len` bytes of `elems`.
    pub(super) fn receive(message: Message, mut elems: Elems, len: usize) -> Self {
        let bytes: &mut [u8] = &mut elems.bytes_mut()[..len];
        // SAFETY: the bytes lie in `elems`' heap allocation, which the returned value keeps
        // alive and which moving `elems` does not move; this view is the only reference to
        // it until the request completes, and only then is `elems` handed back.
        let view: &'static mut [u8] = unsafe { &mut *std::ptr::from_mut(bytes) };
        let request = message.immediate_matched_receive_into(StaticScope, view);
        Self {
            request,
            owner: Owner::Elems(elems),
        }
    }

    /// The buffer, once MPI completed the request; the request itself while it is under way.
    pub(super) fn test(self) -> Result<Owner, Self> {
        match self.request.test() {
            Ok(_) => Ok(self.owner),
            Err(request) => Err(Self {
                request,
                owner: self.owner,
            }),
        }
    }

    /// Whether this sends a tensor's bytes (not an envelope or a notice, which are small).
    pub(super) fn sends_tensor(&self) -> bool {
        matches!(self.owner, Owner::Data(_) | Owner::Borrowed(_))
    }
}

/// A tensor's data lent to a send as borrowed bytes, as a rank lends the shards it holds
/// (tests only).
#[cfg(test)]
#[derive(Debug)]
pub(super) struct Held(pub(super) TensorData);

// SAFETY: the data is owned by the `Held` and never written while it exists.
#[cfg(test)]
unsafe impl HostBytes for Held {
    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
    fn dtype(&self) -> burn::tensor::DType {
        self.0.dtype
    }
    fn shape(&self) -> Vec<usize> {
        self.0.shape.to_vec()
    }
}
