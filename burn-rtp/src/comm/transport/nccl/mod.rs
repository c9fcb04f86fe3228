//! One rank per process and per GPU: payloads move GPU to GPU through NCCL (cudarc's binding,
//! the one cubecl-cuda uses), and everything else goes over MPI.
//!
//! MPI carries what NCCL cannot: the start-up (rank 0's NCCL unique id reaches the others),
//! one small control message ahead of each payload (its element type and shape, checked
//! against the receiver's header before NCCL is given a buffer; see `control`), abort notices
//! and the exit. NCCL carries the tensors' bytes, on a CUDA stream of the transport's own, so
//! that a shard moves while the rank's kernels run on cubecl's stream.
//!
//! An exchange's sends and receives are held until [`Transport::flush`] and then issued as
//! one NCCL group: NCCL's send and receive block in stream order, so a ring of ranks that each
//! issued "receive from the left" before "send to the right" one by one would wait for each
//! other for ever. Before the group, the rank's compute stream is synchronised: a send's
//! tensor must be written, and a receive buffer's memory may have been a tensor that queued
//! kernels still read. The payload's handle then waits on the group's CUDA event.
//!
//! The cost of the control message: a receive is posted only once its sender's control
//! message has arrived, so a rank whose peer reaches the exchange late waits at the
//! exchange's start (in `flush`) rather than during its compute, as it would under MPI. In a
//! ring that runs in step the wait is the ranks' skew. Posting the receive first, at the size
//! the header announces, would hide it, but NCCL leaves a size mismatch undefined, and the
//! check would come after the bytes had been written.
//!
//! Only `Rtp<Cuda>` (cubecl's CUDA runtime, without Burn's fusion) can use it: the transport
//! moves `CubeTensor<CudaRuntime>` and says so at start-up for any other backend. NCCL
//! refuses two ranks on one GPU, so each rank needs its own GPU (`CudaDevice::new(rank)` on
//! one host).

mod control;
#[cfg(feature = "nccl")]
mod sys;

#[cfg(feature = "nccl")]
pub use transport::{NcclEndpoint, NcclTransport};

#[cfg(feature = "nccl")]
mod transport {
    use super::control;
    use super::sys::{Buffer, Communicator, Direction, InFlight, Op, UniqueId};
    use crate::comm::transport::{
        transport_error, BufferKind, Header, MpiEndpoint, Payload, RecvHandle, SendHandle,
        Transport,
    };
    use crate::error::{RtpError, RtpResult};
    use crate::state::accounting::Charge;
    use burn::tensor::TensorData;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::cuda::{CudaDevice, CudaRuntime};
    use cubecl::Runtime;
    use std::any::Any;
    use std::borrow::Cow;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// Where a transfer's outcome goes once its group is issued.
    type Slot = mpsc::Sender<RtpResult<InFlight>>;

    /// A send or receive held until the next flush.
    enum Held {
        Send {
            to: usize,
            tensor: Box<CubeTensor<CudaRuntime>>,
            slot: Slot,
        },
        Recv {
            from: usize,
            expect: Header,
            control: Box<dyn RecvHandle<()>>,
            slot: Slot,
        },
    }

    /// This process's rank, moving tensors over NCCL and control messages over MPI.
    pub struct NcclTransport {
        rank: usize,
        size: usize,
        timeout: Duration,
        control: MpiEndpoint,
        device: CudaDevice,
        comm: Mutex<Communicator>,
        held: Mutex<Vec<Held>>,
        sent: AtomicU64,
    }

    impl std::fmt::Debug for NcclTransport {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "NcclTransport(rank {} of {})", self.rank, self.size)
        }
    }

    /// Moves a value of one type into another that is the same type (checked at run time).
    fn cast<A: 'static, T: 'static>(value: A) -> Option<T> {
        (Box::new(value) as Box<dyn Any>)
            .downcast::<T>()
            .ok()
            .map(|b| *b)
    }

    impl NcclTransport {
        /// Joins the NCCL communicator of every rank of the MPI world `control`, on this
        /// rank's `device` (which must be a `CudaDevice`, as the inner backend must be
        /// cubecl's CUDA runtime: `T` is its float tensor). Blocks until every rank joined.
        pub fn start<T: 'static>(
            control: MpiEndpoint,
            device: &dyn Any,
            peer_timeout: Duration,
        ) -> RtpResult<Self> {
            let unavailable = |reason: String| RtpError::TransportUnavailable {
                transport: "nccl".into(),
                reason,
            };
            if std::any::TypeId::of::<T>() != std::any::TypeId::of::<CubeTensor<CudaRuntime>>() {
                return Err(unavailable(format!(
                    "NCCL moves CUDA tensors: the inner backend must be `burn::backend::Cuda` \
                     (without fusion), not one whose tensors are `{}`",
                    std::any::type_name::<T>()
                )));
            }
            let device = device
                .downcast_ref::<CudaDevice>()
                .ok_or_else(|| unavailable("the rank's device is not a `CudaDevice`".into()))?
                .clone();
            let rank = Transport::<()>::rank(&control);
            let size = Transport::<()>::world_size(&control);
            let id = share_unique_id(&control, rank, size)?;
            let comm = Communicator::join(device.index, rank, size, id)
                .map_err(|reason| transport_error(rank, "ncclCommInitRank", reason))?;
            Ok(Self {
                rank,
                size,
                timeout: peer_timeout,
                control,
                device,
                comm: Mutex::new(comm),
                held: Mutex::new(Vec::new()),
                sent: AtomicU64::new(0),
            })
        }

        /// Issues every held send and receive as one NCCL group.
        fn issue(&self) -> RtpResult<()> {
            let held = std::mem::take(&mut *self.held.lock().unwrap());
            if held.is_empty() {
                return Ok(());
            }
            // The peers' control messages must have left before this rank waits for theirs.
            Transport::<()>::flush(&self.control)?;
            let client = CudaRuntime::client(&self.device);
            let mut ops = Vec::with_capacity(held.len());
            let mut slots = Vec::with_capacity(held.len());
            let mut failure = None;
            for h in held {
                let slot = match &h {
                    Held::Send { slot, .. } | Held::Recv { slot, .. } => slot.clone(),
                };
                // After a failure nothing more is waited for: each wait could last a timeout.
                if let Some(e) = &failure {
                    let _ = slot.send(Err(RtpError::clone(e)));
                    continue;
                }
                let op = match h {
                    Held::Send { to, tensor, .. } => Buffer::of(*tensor)
                        .map(|b| (Direction::Send, to, b))
                        .map_err(Issue::Other),
                    Held::Recv {
                        from,
                        expect,
                        control,
                        ..
                    } => self.receive_buffer(&client, from, &expect, control),
                };
                match op {
                    Ok((direction, peer, buffer)) => {
                        ops.push(Op {
                            direction,
                            peer,
                            buffer,
                        });
                        slots.push(slot);
                    }
                    Err(e) => {
                        let e = match e {
                            Issue::Typed(e) => e,
                            Issue::Other(reason) => transport_error(self.rank, "nccl", reason),
                        };
                        let _ = slot.send(Err(e.clone()));
                        failure = Some(e);
                    }
                }
            }
            if let Some(e) = failure {
                for slot in slots {
                    let _ = slot.send(Err(e.clone()));
                }
                return Err(e);
            }
            // Sends read tensors the compute stream wrote; receives write memory the compute
            // stream may still read as another tensor's.
            cubecl::future::block_on(client.sync())
                .map_err(|e| transport_error(self.rank, "sync", format!("{e:?}")))?;
            match self.comm.lock().unwrap().group(ops) {
                Ok(in_flight) => {
                    for (slot, transfer) in slots.into_iter().zip(in_flight) {
                        let _ = slot.send(Ok(transfer));
                    }
                    Ok(())
                }
                Err(reason) => {
                    let e = transport_error(self.rank, "ncclGroupEnd", reason);
                    for slot in slots {
                        let _ = slot.send(Err(e.clone()));
                    }
                    Err(e)
                }
            }
        }

        /// Waits for the control message of a receive and makes the buffer it announces.
        fn receive_buffer(
            &self,
            client: &cubecl::client::ComputeClient<CudaRuntime>,
            from: usize,
            expect: &Header,
            control: Box<dyn RecvHandle<()>>,
        ) -> Result<(Direction, usize, Buffer), Issue> {
            let body = match control.wait().map_err(Issue::Typed)? {
                Payload::Host(data) => data,
                _ => return Err(Issue::Other("a control message without host data".into())),
            };
            let dtype = control::decode(self.rank, from, expect, &body).map_err(Issue::Typed)?;
            let shape = burn::tensor::Shape::from(expect.shape.clone());
            let handle = client.empty(shape.num_elements() * dtype.size());
            let tensor = CubeTensor::new_contiguous(
                client.clone(),
                self.device.clone(),
                shape,
                handle,
                dtype,
            );
            let buffer = Buffer::of(tensor).map_err(Issue::Other)?;
            Ok((Direction::Recv, from, buffer))
        }

        /// Waits for a transfer's group to be issued, then for the transfer itself.
        fn complete(
            &self,
            outcome: &mpsc::Receiver<RtpResult<InFlight>>,
            op: &str,
            peer: usize,
        ) -> RtpResult<CubeTensor<CudaRuntime>> {
            self.issue()?;
            let started = Instant::now();
            let in_flight = outcome
                .recv()
                .map_err(|_| transport_error(self.rank, op, "the transfer was never issued"))??;
            in_flight.wait(started + self.timeout).map_err(|why| {
                // A peer that died leaves NCCL waiting: stop it, so that nothing hangs.
                self.comm.lock().unwrap().abort();
                RtpError::Timeout {
                    rank: self.rank,
                    op: format!("{op} ({})", why.0),
                    peer,
                    secs: started.elapsed().as_secs_f64(),
                }
            })
        }
    }

    /// Why a held transfer could not be issued.
    enum Issue {
        Typed(RtpError),
        Other(String),
    }

    /// Rank 0 makes NCCL's unique id and sends it to every other rank over MPI.
    fn share_unique_id(control: &MpiEndpoint, rank: usize, size: usize) -> RtpResult<UniqueId> {
        let header = Header {
            seq: 0,
            op: Cow::Borrowed("ncclGetUniqueId"),
            part: 0,
            shape: vec![128],
        };
        if rank == 0 {
            let id = super::sys::unique_id()
                .map_err(|reason| transport_error(0, "ncclGetUniqueId", reason))?;
            let data = Arc::new(TensorData::new(id.to_vec(), [128]));
            let sends = (1..size)
                .map(|peer| {
                    Transport::<()>::isend(
                        control,
                        peer,
                        header.clone(),
                        Payload::Host(data.clone()),
                        Vec::new(),
                    )
                })
                .collect::<RtpResult<Vec<_>>>()?;
            Transport::<()>::flush(control)?;
            for s in sends {
                s.wait()?;
            }
            return Ok(id);
        }
        let got = Transport::<()>::irecv(control, 0, header)?.wait()?;
        let Payload::Host(data) = got else {
            return Err(transport_error(rank, "ncclGetUniqueId", "no host data"));
        };
        let bytes = data
            .as_slice::<u8>()
            .map_err(|e| transport_error(rank, "ncclGetUniqueId", format!("{e:?}")))?;
        bytes
            .try_into()
            .map_err(|_| transport_error(rank, "ncclGetUniqueId", "an id of the wrong length"))
    }

    /// A send, complete once NCCL has read its tensor (and MPI sent its control message).
    struct NcclSend {
        transport: Arc<NcclTransport>,
        to: usize,
        op: String,
        outcome: mpsc::Receiver<RtpResult<InFlight>>,
        control: Box<dyn SendHandle>,
        _hold: Vec<Arc<Charge>>,
    }

    impl SendHandle for NcclSend {
        fn wait(self: Box<Self>) -> RtpResult<()> {
            self.transport
                .complete(&self.outcome, &self.op, self.to)
                .map(drop)?;
            self.control.wait()
        }
    }

    /// A receive, complete once NCCL has written its buffer.
    struct NcclRecv {
        transport: Arc<NcclTransport>,
        from: usize,
        op: String,
        outcome: mpsc::Receiver<RtpResult<InFlight>>,
    }

    impl<T: Send + 'static> RecvHandle<T> for NcclRecv {
        fn wait(self: Box<Self>) -> RtpResult<Payload<T>> {
            let tensor = self
                .transport
                .complete(&self.outcome, &self.op, self.from)?;
            let tensor = cast::<_, T>(tensor).expect("checked when the transport started");
            Ok(Payload::Device(tensor))
        }
    }

    /// The handle ranks hold: shared, so that send and receive handles can outlive the call.
    #[derive(Debug, Clone)]
    pub struct NcclEndpoint(pub Arc<NcclTransport>);

    impl<T: Send + 'static> Transport<T> for NcclEndpoint {
        fn rank(&self) -> usize {
            self.0.rank
        }

        fn world_size(&self) -> usize {
            self.0.size
        }

        fn buffer_kind(&self) -> BufferKind {
            BufferKind::Device
        }

        fn isend(
            &self,
            to: usize,
            header: Header,
            payload: Payload<T>,
            hold: Vec<Arc<Charge>>,
        ) -> RtpResult<Box<dyn SendHandle>> {
            let op = header.op.to_string();
            crate::config::check_rank(to, self.0.size)?;
            let Payload::Device(tensor) = payload else {
                return Err(transport_error(
                    self.0.rank,
                    &op,
                    "the NCCL transport moves device tensors only",
                ));
            };
            let tensor: CubeTensor<CudaRuntime> =
                cast(tensor).expect("checked when the transport started");
            // NCCL reads the elements as one run of memory.
            let tensor = burn_cubecl::kernel::into_contiguous(tensor);
            let body = control::encode(self.0.rank, &op, tensor.dtype, &header.shape)?;
            let bytes = tensor.meta.shape().num_elements() * tensor.dtype.size();
            let control = Transport::<()>::isend(
                &self.0.control,
                to,
                control::header(&header),
                Payload::Host(Arc::new(body)),
                Vec::new(),
            )?;
            let (slot, outcome) = mpsc::channel();
            self.0.held.lock().unwrap().push(Held::Send {
                to,
                tensor: Box::new(tensor),
                slot,
            });
            self.0.sent.fetch_add(bytes as u64, Ordering::Relaxed);
            Ok(Box::new(NcclSend {
                transport: self.0.clone(),
                to,
                op,
                outcome,
                control,
                _hold: hold,
            }))
        }

        fn irecv(&self, from: usize, expect: Header) -> RtpResult<Box<dyn RecvHandle<T>>> {
            crate::config::check_rank(from, self.0.size)?;
            let control = Transport::<()>::irecv(&self.0.control, from, control::header(&expect))?;
            let (slot, outcome) = mpsc::channel();
            let op = expect.op.to_string();
            self.0.held.lock().unwrap().push(Held::Recv {
                from,
                expect,
                control,
                slot,
            });
            Ok(Box::new(NcclRecv {
                transport: self.0.clone(),
                from,
                op,
                outcome,
            }))
        }

        fn flush(&self) -> RtpResult<()> {
            self.0.issue()
        }

        fn abort(&self, reason: &str) {
            self.0.comm.lock().unwrap().abort();
            Transport::<()>::abort(&self.0.control, reason);
        }

        fn mark_exited(&self) {
            Transport::<()>::mark_exited(&self.0.control);
        }

        fn sent_bytes(&self) -> u64 {
            self.0.sent.load(Ordering::Relaxed)
        }

        fn progress_policy(&self) -> Option<String> {
            Some(format!(
                "NCCL on a CUDA stream of its own; MPI control messages: {}",
                Transport::<()>::progress_policy(&self.0.control).unwrap_or_default()
            ))
        }
    }
}
