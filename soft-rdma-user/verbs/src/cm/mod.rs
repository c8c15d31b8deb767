//! rdma_cm (`rdma/rdma_cma.h`) on soft-rdmad's connector: event channels, communication ids and their
//! events. `addr` owns addresses (bind, resolve, getaddrinfo, ports), `conn` the connection calls (connect,
//! listen, accept, reject, disconnect, the ids' queue pairs, endpoints); docs/rdma-core.md has the table
//! of which connector call and status makes which event.
//!
//! An event channel is a pipe (one byte per queued event, `export::EventPipe`), so that its fd polls and a
//! blocking or O_NONBLOCK `rdma_get_cm_event` behaves as rdma-core's `read` of the kernel's file. An id
//! made without a channel (`rdma_create_id(NULL, …)`, `rdma_create_ep`) is synchronous: its events queue on
//! the id itself, and each call that makes one (resolve_addr, resolve_route, connect, accept, disconnect;
//! `rdma_get_request` on a listener) waits for it and leaves it, unacknowledged, in `id->event`, as
//! rdma-core's `ucma_complete` does; the next such call, `rdma_migrate_id` out of synchronous mode or
//! `rdma_destroy_id` acknowledges it. The ids a synchronous listener's requests make are synchronous too,
//! each with its own events. `rdma_destroy_id` waits until every event reported on the id is acknowledged
//! (rdma-core `rdma_destroy_id`).

mod addr;
mod conn;

pub use addr::*;
pub use conn::*;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};

use libc::{c_char, c_int, c_void};
use soft_rdma::client::{Connector, Listener};

use crate::abi::*;
use crate::device::Context;
use crate::export::{CCell, CObject, Errno, EventPipe, Registry, export, guard, ret_minus_one, ret_ptr};
use crate::qp::Qp;
use crate::state::{self, Process};

#[repr(C)]
pub(crate) struct Channel {
    c: CCell<rdma_event_channel>,
    pipe: EventPipe,
    queue: Mutex<VecDeque<usize>>,
}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Channel {
    type C = rdma_event_channel;
    const KIND: &'static str = "rdma_cm event channel";
}

static CHANNELS: Registry<Channel> = Registry::new();

/// A communication id.
#[repr(C)]
pub(crate) struct Id {
    c: CCell<rdma_cm_id>,
    pub(crate) process: Arc<Process>,
    /// The id's channel: the program's, or (synchronous) one of its own, as rdma-core's `ucma_alloc_id`
    /// makes with `rdma_create_event_channel`.
    channel: Mutex<Arc<Channel>>,
    /// Synchronous: the calls wait for their own events (rdma-core's `id_priv->sync`).
    sync: AtomicBool,
    pub(crate) state: Mutex<IdState>,
    /// (taken, acknowledged) events, and the wait of `rdma_destroy_id` for the acknowledgements (rdma-core
    /// waits for the events the program took; those still queued are dropped with the id, as the kernel's
    /// `ucma_destroy_id` drops them).
    events: Mutex<(u64, u64)>,
    acked: Condvar,
    /// DISCONNECTED was reported (once, whichever side ended the connection).
    pub(crate) disconnected: AtomicBool,
}

/// What an id holds besides its C struct.
#[derive(Default)]
pub(crate) struct IdState {
    /// Bound address (`rdma_bind_addr`, `rdma_resolve_addr`, `rdma_listen`).
    pub(crate) local: Option<SocketAddr>,
    pub(crate) remote: Option<SocketAddr>,
    pub(crate) connector: Option<Arc<Connector>>,
    pub(crate) listener: Option<Arc<Listener>>,
    pub(crate) tasks: Vec<tokio::task::AbortHandle>,
    pub(crate) qp: Option<Arc<Qp>>,
    /// CQs `rdma_create_qp` made for the id (destroyed with its queue pair).
    pub(crate) own_cqs: Vec<(*mut ibv_cq, *mut ibv_comp_channel)>,
    /// `rdma_create_ep` on a passive id: the PD and attributes `rdma_get_request` makes each new id's
    /// queue pair with.
    pub(crate) ep_qp: Option<(*mut ibv_pd, ibv_qp_init_attr)>,
}

// SAFETY: the raw pointers are handles, checked in their registries before use.
unsafe impl Send for IdState {}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Id {
    type C = rdma_cm_id;
    const KIND: &'static str = "rdma_cm id";
}

pub(crate) static IDS: Registry<Id> = Registry::new();

#[repr(C)]
pub(crate) struct Event {
    c: CCell<rdma_cm_event>,
    id: Arc<Id>,
    _private_data: Box<[u8]>,
}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Event {
    type C = rdma_cm_event;
    const KIND: &'static str = "rdma_cm event";
}

static EVENTS: Registry<Event> = Registry::new();

/// What an event says besides its type.
#[derive(Default)]
pub(crate) struct EventData {
    pub(crate) status: c_int,
    pub(crate) private_data: Vec<u8>,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) listen_id: Option<*mut rdma_cm_id>,
}

impl Id {
    pub(crate) fn ibv(&self) -> *mut rdma_cm_id {
        self.c.get()
    }

    pub(crate) fn channel(&self) -> Arc<Channel> {
        self.channel.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn is_sync(&self) -> bool {
        self.sync.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, IdState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports an event on the id's channel, or to its synchronous caller.
    pub(crate) fn deliver(self: &Arc<Self>, event: c_int, data: EventData) {
        self.deliver_via(self, event, data);
    }

    /// Reports an event about this id on `via`'s channel or to `via`'s synchronous caller (a listener's
    /// CONNECT_REQUEST is about the new id).
    pub(crate) fn deliver_via(self: &Arc<Self>, via: &Arc<Id>, event: c_int, data: EventData) {
        let private: Box<[u8]> = data.private_data.into_boxed_slice();
        let ev = Arc::new(Event {
            c: CCell::new(rdma_cm_event {
                id: self.ibv(),
                listen_id: data.listen_id.unwrap_or(std::ptr::null_mut()),
                event,
                status: data.status,
                param: rdma_cm_event_param {
                    conn: rdma_conn_param {
                        private_data: if private.is_empty() {
                            std::ptr::null()
                        } else {
                            private.as_ptr().cast()
                        },
                        private_data_len: private.len().min(255) as u8,
                        responder_resources: data.responder_resources,
                        initiator_depth: data.initiator_depth,
                        flow_control: 0,
                        retry_count: 0,
                        rnr_retry_count: 0,
                        srq: 0,
                        qp_num: 0,
                    },
                    _ud_rest: [0; 4],
                },
            }),
            id: self.clone(),
            _private_data: private,
        });
        let p = EVENTS.insert(ev) as usize;
        tracing::debug!(event = event_name(event), "rdma_cm event");
        via.channel().push(p);
    }

    /// A synchronous id's next event, from its own channel (waiting for it unless the program made the
    /// channel's fd O_NONBLOCK: EAGAIN, as rdma-core's `rdma_get_cm_event` in `ucma_complete`).
    pub(crate) fn next_sync_event(&self) -> Result<*mut rdma_cm_event, Errno> {
        self.channel().next()
    }

    /// On a synchronous id, what rdma-core's `ucma_complete` does after each call that makes an event:
    /// acknowledges the event the previous call left in `id->event`, waits for the next one and leaves it
    /// there (a program reads the peer's private data from it), and turns a nonzero status into the call's
    /// error (REJECTED: ECONNREFUSED; otherwise the status as errno). The event's type is not checked, as
    /// rdma-core does not. No-op with a channel.
    pub(crate) fn complete(&self) -> Result<(), Errno> {
        if !self.is_sync() {
            return Ok(());
        }
        self.ack_last();
        let p = self.next_sync_event()?;
        // SAFETY: the live id's field; an event this id delivered, still registered.
        let (event, status) = unsafe {
            (*self.ibv()).event = p;
            ((*p).event, (*p).status)
        };
        sync_result(event, status)
    }

    /// Acknowledges the event a synchronous call left in `id->event` (rdma-core: the next waiting call,
    /// `rdma_migrate_id` out of synchronous mode, or `rdma_destroy_id`).
    pub(crate) fn ack_last(&self) {
        // SAFETY: the live id's field.
        let last = unsafe { std::mem::replace(&mut (*self.ibv()).event, std::ptr::null_mut()) };
        if !last.is_null() {
            let _ = ack(last);
        }
    }

    /// The type of the event in `id->event` (None when there is none).
    pub(crate) fn last_event(&self) -> Option<c_int> {
        // SAFETY: the live id's field; an event it holds stays registered until acknowledged.
        unsafe {
            let p = (*self.ibv()).event;
            EVENTS.find(p).map(|_| (*p).event)
        }
    }

    /// Sets `verbs` (the ids' shared context) once the id has an address on the device.
    pub(crate) fn set_verbs(&self) -> Result<(), Errno> {
        let ctx = cm_context(&self.process)?;
        // SAFETY: the live id's field.
        unsafe { (*self.ibv()).verbs = ctx.ibv() };
        Ok(())
    }
}

/// A synchronous call's result for the event it waited for (rdma-core `ucma_complete`).
fn sync_result(event: c_int, status: c_int) -> Result<(), Errno> {
    match status {
        0 => Ok(()),
        _ if event == RDMA_CM_EVENT_REJECTED => Err(libc::ECONNREFUSED),
        s if s < 0 => Err(-s),
        s => Err(s),
    }
}

/// The live id `p` names, or EINVAL.
pub(crate) fn id(p: *const rdma_cm_id) -> Result<Arc<Id>, Errno> {
    IDS.get(p)
}

/// The context every rdma_cm id's `verbs` points at (rdma-core opens one per device for all ids).
pub(crate) fn cm_context(process: &Arc<Process>) -> Result<Arc<Context>, Errno> {
    let p = match process.cm_context.get() {
        Some(&p) => p,
        None => {
            let made = crate::device::open_context(process.clone())? as usize;
            *process.cm_context.get_or_init(|| made)
        }
    };
    crate::device::context(p as *const ibv_context)
}

impl Channel {
    fn new() -> Result<Arc<Channel>, Errno> {
        let pipe = EventPipe::new()?;
        Ok(Arc::new(Channel {
            c: CCell::new(rdma_event_channel { fd: pipe.read }),
            pipe,
            queue: Mutex::default(),
        }))
    }

    /// A channel of an id's own (synchronous), registered so that `id->channel` is a live handle.
    fn private() -> Result<Arc<Channel>, Errno> {
        let ch = Channel::new()?;
        CHANNELS.insert(ch.clone());
        Ok(ch)
    }

    /// Queues the event at `p`.
    fn push(&self, p: usize) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push_back(p);
        self.pipe.ring();
    }

    /// The next event (waiting unless the fd is O_NONBLOCK). A byte whose event was dropped with its id
    /// has none left: it waits for the next one.
    fn next(&self) -> Result<*mut rdma_cm_event, Errno> {
        loop {
            self.pipe.wait()?;
            let next = self.queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            if let Some(p) = next.filter(|&p| taken(p)) {
                return Ok(p as *mut rdma_cm_event);
            }
        }
    }
}

/// A new id on `channel` (None: synchronous, on a channel of its own).
pub(crate) fn new_id(
    process: Arc<Process>,
    channel: Option<Arc<Channel>>,
    context: *mut c_void,
    ps: c_int,
) -> Result<Arc<Id>, Errno> {
    let sync = channel.is_none();
    let channel = match channel {
        Some(ch) => ch,
        None => Channel::private()?,
    };
    // SAFETY: all-zero is a valid rdma_cm_id (pointers NULL, addresses AF_UNSPEC).
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = channel.c.get();
    c.context = context;
    c.ps = ps;
    c.port_num = 1;
    c.qp_type = IBV_QPT_RC;
    Ok(Arc::new(Id {
        c: CCell::new(c),
        process,
        channel: Mutex::new(channel),
        sync: AtomicBool::new(sync),
        state: Mutex::default(),
        events: Mutex::new((0, 0)),
        acked: Condvar::new(),
        disconnected: AtomicBool::new(false),
    }))
}

/// The program takes the event at `p` (false: it was dropped with its id meanwhile).
fn taken(p: usize) -> bool {
    match EVENTS.find(p as *const rdma_cm_event) {
        Some(ev) => {
            ev.id.events.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
            true
        }
        None => false,
    }
}

/// Drops the events about `id` still queued in `queue` (never taken, so never acknowledged).
fn drop_queued(queue: &Mutex<VecDeque<usize>>, id: &Arc<Id>) {
    for p in take_queued(queue, id) {
        let _ = EVENTS.remove(p as *const rdma_cm_event);
    }
}

pub(crate) fn ack(p: *mut rdma_cm_event) -> Result<(), Errno> {
    let ev = EVENTS.remove(p)?;
    let mut n = ev.id.events.lock().unwrap_or_else(|e| e.into_inner());
    n.1 += 1;
    ev.id.acked.notify_all();
    Ok(())
}

/// soft-rdmad went away: every id on a channel hears RDMA_CM_EVENT_DEVICE_REMOVAL.
pub(crate) fn device_removed() {
    for id in IDS.all() {
        if !id.is_sync() {
            id.deliver(RDMA_CM_EVENT_DEVICE_REMOVAL, EventData::default());
        }
    }
}

/// `ibv_modify_qp` to IBV_QPS_ERR of a connected queue pair: its id disconnects (which flushes what is
/// posted) and reports DISCONNECTED. False when no id carries `qp` (it was never connected).
pub(crate) fn disconnect_qp(qp: &Qp) -> bool {
    let Some(id) = IDS.all().into_iter().find(|id| {
        id.lock()
            .qp
            .as_ref()
            .is_some_and(|q| std::ptr::eq(Arc::as_ptr(q), qp))
    }) else {
        return false;
    };
    conn::disconnect(&id).is_ok()
}

/// `ibv_destroy_qp` of an id's queue pair: the id has none from then on.
pub(crate) fn qp_destroyed(qp: *mut ibv_qp) {
    for id in IDS.all() {
        // SAFETY: the live id's field.
        unsafe {
            if (*id.ibv()).qp == qp {
                (*id.ibv()).qp = std::ptr::null_mut();
                id.lock().qp = None;
            }
        }
    }
}

export!("RDMACM_1.0";
fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ret_ptr("rdma_create_event_channel", || {
        // rdma-core's ucma_init: ENODEV when no device is found.
        state::process()?;
        Ok(CHANNELS.insert(Channel::new()?))
    })
});

export!("RDMACM_1.0";
fn rdma_destroy_event_channel(p: *mut rdma_event_channel) {
    guard("rdma_destroy_event_channel", (), || {
        let _ = CHANNELS.remove(p);
    })
});

export!("RDMACM_1.0";
fn rdma_create_id(channel: *mut rdma_event_channel, out: *mut *mut rdma_cm_id, context: *mut c_void, ps: c_int) -> c_int {
    ret_minus_one("rdma_create_id", || {
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let channel = if channel.is_null() { None } else { Some(CHANNELS.get(channel)?) };
        check_port_space(ps)?;
        let process = state::process()?;
        let id = new_id(process, channel, context, ps)?;
        // SAFETY: the caller's out-parameter.
        unsafe { *out = IDS.insert(id) };
        Ok(())
    })
});

/// RDMA_PS_TCP only: iWARP connects over TCP (RFC 5044). The UDP, IPoIB and IB port spaces are services
/// soft-rdma lacks (ENOSYS); anything else is not a port space (EINVAL, as the kernel's
/// `ucma_get_qp_type` answers).
fn check_port_space(ps: c_int) -> Result<(), Errno> {
    match ps {
        RDMA_PS_TCP => Ok(()),
        RDMA_PS_UDP | RDMA_PS_IPOIB | RDMA_PS_IB => Err(libc::ENOSYS),
        _ => Err(libc::EINVAL),
    }
}

export!("RDMACM_1.0";
fn rdma_destroy_id(p: *mut rdma_cm_id) -> c_int {
    ret_minus_one("rdma_destroy_id", || {
        let id = IDS.remove(p)?;
        // The event the last synchronous call left in `id->event` (rdma-core `rdma_destroy_id`).
        id.ack_last();
        let (connector, listener, tasks) = {
            let mut s = id.lock();
            (s.connector.take(), s.listener.take(), std::mem::take(&mut s.tasks))
        };
        for t in tasks {
            t.abort();
        }
        // An accept abandoned with its task: posters waiting for it go on (and are refused).
        if let Some(qp) = id.lock().qp.clone() {
            qp.end_accept();
        }
        // Dropping the connector disconnects it; the listener stops listening.
        let _runtime = state::handle().enter();
        drop(connector);
        drop(listener);
        // Events not taken yet are dropped: those about the id on the program's channel, all of a
        // synchronous id's own (a listener's hold the new ids' requests), whose channel goes with it.
        let ch = id.channel();
        if id.is_sync() {
            for p in std::mem::take(&mut *ch.queue.lock().unwrap_or_else(|e| e.into_inner())) {
                let _ = EVENTS.remove(p as *const rdma_cm_event);
            }
            let _ = CHANNELS.remove(ch.c.get());
        } else {
            drop_queued(&ch.queue, &id);
        }
        let mut n = id.events.lock().unwrap_or_else(|e| e.into_inner());
        while n.1 < n.0 {
            n = id.acked.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    })
});

export!("RDMACM_1.0";
/// Waits (unless O_NONBLOCK is set on `channel->fd`) for the channel's next event.
fn rdma_get_cm_event(channel: *mut rdma_event_channel, out: *mut *mut rdma_cm_event) -> c_int {
    ret_minus_one("rdma_get_cm_event", || {
        let ch = CHANNELS.get(channel)?;
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let p = ch.next()?;
        // SAFETY: the caller's out-parameter.
        unsafe { *out = p };
        Ok(())
    })
});

export!("RDMACM_1.0";
fn rdma_ack_cm_event(p: *mut rdma_cm_event) -> c_int {
    ret_minus_one("rdma_ack_cm_event", || ack(p))
});

export!("RDMACM_1.0";
/// Moves `id` to `channel`, or to synchronous mode (NULL), as rdma-core does: leaving synchronous mode
/// acknowledges the event in `id->event`; an id already synchronous cannot be made so again (EINVAL);
/// the move waits until the events the program took on the old channel are acknowledged, and those not
/// taken yet follow the id (the kernel's `ucma_migrate_id` moves them).
fn rdma_migrate_id(p: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    ret_minus_one("rdma_migrate_id", || {
        let id = id(p)?;
        let to_sync = channel.is_null();
        if to_sync && id.is_sync() {
            return Err(libc::EINVAL);
        }
        let new = if to_sync { Channel::private()? } else { CHANNELS.get(channel)? };
        let old = id.channel();
        let was_sync = id.is_sync();
        if was_sync {
            id.ack_last();
        }
        {
            let mut n = id.events.lock().unwrap_or_else(|e| e.into_inner());
            while n.1 < n.0 {
                n = id.acked.wait(n).unwrap_or_else(|e| e.into_inner());
            }
        }
        // A synchronous id's own channel holds only its events (and a listener's requests).
        let pending: Vec<usize> = if was_sync {
            std::mem::take(&mut *old.queue.lock().unwrap_or_else(|e| e.into_inner())).into()
        } else {
            take_queued(&old.queue, &id)
        };
        // SAFETY: the live id's field.
        unsafe { (*id.ibv()).channel = new.c.get() };
        *id.channel.lock().unwrap_or_else(|e| e.into_inner()) = new.clone();
        id.sync.store(to_sync, std::sync::atomic::Ordering::Release);
        for p in pending {
            new.push(p);
        }
        if was_sync {
            let _ = CHANNELS.remove(old.c.get());
        }
        Ok(())
    })
});

/// Takes the events about `id` still queued in `queue` out of it, in order.
fn take_queued(queue: &Mutex<VecDeque<usize>>, id: &Arc<Id>) -> Vec<usize> {
    let mut taken = Vec::new();
    queue.lock().unwrap_or_else(|e| e.into_inner()).retain(|&p| {
        let about_id = EVENTS
            .find(p as *const rdma_cm_event)
            .is_some_and(|ev| Arc::ptr_eq(&ev.id, id));
        if about_id {
            taken.push(p);
        }
        !about_id
    });
    taken
}

/// rdma-core's words for each event (`rdma_event_str`).
fn event_name(event: c_int) -> &'static str {
    match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => "RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => "RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => "RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => "RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => "RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => "RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => "RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => "RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => "RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => "RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => "RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => "RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => "RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => "RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => "RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => "UNKNOWN EVENT",
    }
}

export!("RDMACM_1.0";
fn rdma_event_str(event: c_int) -> *const c_char {
    // Static NUL-terminated copies of `event_name`.
    macro_rules! c { ($($e:ident),*) => { match event { $( $e => concat!(stringify!($e), "\0").as_ptr(), )* _ => c"UNKNOWN EVENT".as_ptr().cast() } } }
    c!(
        RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_CM_EVENT_ADDR_ERROR, RDMA_CM_EVENT_ROUTE_RESOLVED,
        RDMA_CM_EVENT_ROUTE_ERROR, RDMA_CM_EVENT_CONNECT_REQUEST, RDMA_CM_EVENT_CONNECT_RESPONSE,
        RDMA_CM_EVENT_CONNECT_ERROR, RDMA_CM_EVENT_UNREACHABLE, RDMA_CM_EVENT_REJECTED,
        RDMA_CM_EVENT_ESTABLISHED, RDMA_CM_EVENT_DISCONNECTED, RDMA_CM_EVENT_DEVICE_REMOVAL,
        RDMA_CM_EVENT_MULTICAST_JOIN, RDMA_CM_EVENT_MULTICAST_ERROR, RDMA_CM_EVENT_ADDR_CHANGE,
        RDMA_CM_EVENT_TIMEWAIT_EXIT
    ).cast()
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_strings_are_rdma_cores() {
        for e in 0..16 {
            // SAFETY: a static NUL-terminated string.
            let s = unsafe { std::ffi::CStr::from_ptr(rdma_event_str(e)) };
            assert_eq!(s.to_str().unwrap(), event_name(e));
        }
        // SAFETY: as above.
        let unknown = unsafe { std::ffi::CStr::from_ptr(rdma_event_str(99)) };
        assert_eq!(unknown.to_str().unwrap(), "UNKNOWN EVENT");
    }

    #[test]
    fn synchronous_calls_fail_as_ucma_complete() {
        assert_eq!(sync_result(RDMA_CM_EVENT_ESTABLISHED, 0), Ok(()));
        // The type is not checked: a zero status is success.
        assert_eq!(sync_result(RDMA_CM_EVENT_DISCONNECTED, 0), Ok(()));
        assert_eq!(
            sync_result(RDMA_CM_EVENT_REJECTED, -libc::ECONNRESET),
            Err(libc::ECONNREFUSED)
        );
        assert_eq!(
            sync_result(RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT),
            Err(libc::ETIMEDOUT)
        );
        assert_eq!(
            sync_result(RDMA_CM_EVENT_CONNECT_ERROR, libc::ECONNABORTED),
            Err(libc::ECONNABORTED)
        );
    }

    #[test]
    fn only_the_tcp_port_space_is_served() {
        assert_eq!(check_port_space(RDMA_PS_TCP), Ok(()));
        assert_eq!(check_port_space(RDMA_PS_UDP), Err(libc::ENOSYS));
        assert_eq!(check_port_space(RDMA_PS_IB), Err(libc::ENOSYS));
        assert_eq!(check_port_space(7), Err(libc::EINVAL));
    }
}
