//! Shared receive queues (`ibv_create_srq(3)`, kernel siw `siw_create_srq`/`siw_rqe_get`): one queue of
//! posted Receives that every queue pair created on it takes its inbound Sends' buffers from, in posting
//! order, and its limit (`srq_limit`): when armed and fewer than `limit` Receives remain after one is taken,
//! it disarms and the owner is told (IBV_EVENT_SRQ_LIMIT_REACHED). A shared receive queue completes
//! nothing itself: a Receive completes on the receive completion queue of the queue pair that took it, and a
//! queue pair's flush leaves the queue alone (siw `siw_rq_flush` skips an SRQ).
//!
//! The session's data path ([`super::datapath::DataPath`]) owns them, beside completion queues and queue
//! pairs, and bounds their entries with the queue pairs' ([`super::limits::QueueEntries`]).

use std::collections::VecDeque;

pub use super::verbs::{SharedReceiveQueueId, SrqConfig, SrqStatus};
use super::verbs::Sge;

/// The most Receives one shared receive queue holds (`max_srq_wr`; siw's is 327680, libfabric's RxM asks
/// 4096). The session's work-queue entry bound applies as well.
pub const MAX_SRQ_DEPTH: u32 = 32_768;
/// Shared receive queues one session may hold at once (`max_srq`).
pub const MAX_SRQS_PER_SESSION: usize = 1_024;

/// A posted Receive: its buffers and their total length. Queue pairs keep their own receive queue of them
/// too.
#[derive(Debug)]
pub struct PostedReceive {
    pub id: u64,
    pub sgl: Vec<Sge>,
    pub capacity: u64,
}

/// One shared receive queue.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    config: SrqConfig,
    queue: VecDeque<PostedReceive>,
    /// The limit fires at the next Receive taken with fewer than `limit` left (siw `srq->armed`).
    armed: bool,
    /// The limit event is due (taken by [`SharedReceiveQueue::take_limit_event`]).
    limit_reached: bool,
}

impl SharedReceiveQueue {
    /// A queue as `config` says; its limit is armed when nonzero (siw `siw_create_srq`).
    pub fn new(config: SrqConfig) -> Self {
        SharedReceiveQueue {
            config,
            queue: VecDeque::new(),
            armed: config.limit > 0,
            limit_reached: false,
        }
    }

    pub fn config(&self) -> &SrqConfig {
        &self.config
    }

    pub fn status(&self) -> SrqStatus {
        SrqStatus {
            depth: self.config.depth,
            max_sge: self.config.max_sge,
            limit: self.config.limit,
            armed: self.armed,
            posted: self.queue.len() as u32,
        }
    }

    /// Whether another Receive fits (siw `siw_post_srq_recv`: a full ring is ENOMEM).
    pub fn is_full(&self) -> bool {
        self.queue.len() as u64 >= u64::from(self.config.depth)
    }

    /// Queues a Receive the caller checked (SGE count, room, memory).
    pub fn push(&mut self, r: PostedReceive) {
        self.queue.push_back(r);
    }

    /// Arms the limit at `limit`, or disarms it with 0 (siw `siw_modify_srq`). The caller checked it is at
    /// most the depth.
    pub fn set_limit(&mut self, limit: u32) {
        self.config.limit = limit;
        self.armed = limit > 0;
    }

    /// The oldest Receive, for a queue pair's inbound Send (siw `siw_rqe_get`): when armed and fewer than
    /// `limit` remain afterwards, the limit disarms and its event is due.
    pub fn take(&mut self) -> Option<PostedReceive> {
        let r = self.queue.pop_front()?;
        if self.armed && (self.queue.len() as u64) < u64::from(self.config.limit) {
            self.armed = false;
            self.limit_reached = true;
        }
        Some(r)
    }

    /// Whether the limit was reached since last asked (IBV_EVENT_SRQ_LIMIT_REACHED).
    pub fn take_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_reached)
    }

    /// Whether nothing is posted.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(id: u64) -> PostedReceive {
        PostedReceive {
            id,
            sgl: Vec::new(),
            capacity: 0,
        }
    }

    /// Receives come out in posting order; an armed limit fires once, when fewer than `limit` remain, and
    /// disarms; re-arming fires again.
    #[test]
    fn order_and_limit() {
        let mut q = SharedReceiveQueue::new(SrqConfig {
            depth: 4,
            max_sge: 1,
            limit: 2,
        });
        for i in 0..4 {
            assert!(!q.is_full());
            q.push(recv(i));
        }
        assert!(q.is_full());
        assert_eq!(q.take().unwrap().id, 0);
        assert!(!q.take_limit_event(), "3 left, limit 2");
        assert_eq!(q.take().unwrap().id, 1);
        assert!(!q.take_limit_event(), "2 left: not fewer than 2");
        assert_eq!(q.take().unwrap().id, 2);
        assert!(q.take_limit_event(), "1 left");
        assert!(!q.status().armed, "disarmed");
        assert_eq!(q.status().limit, 2, "the limit stays, as siw reports it");
        assert!(!q.take_limit_event(), "once");
        q.set_limit(1);
        assert_eq!(q.take().unwrap().id, 3);
        assert!(q.take_limit_event());
        assert!(q.take().is_none());
        assert!(q.is_empty());
    }
}
