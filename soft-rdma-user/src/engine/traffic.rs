//! What moved through queue pairs, by RDMAP operation and direction ([`OpTraffic`]): a queue pair's
//! [`QpStats`](super::verbs::QpStats) carry one, and soft-rdmad totals them for its metrics (the daemon's
//! own queue pairs and those its clients report). Plain counts with the arithmetic the totals need.

/// The RDMAP data messages (RFC 5040 §4): what a queue pair's traffic is split by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageOp {
    /// Send, with or without Invalidate or Solicited Event.
    Send,
    RdmaWrite,
    /// An RDMA Read Request (no payload: its 28-byte header is the message).
    ReadRequest,
    /// An RDMA Read Response (the data read).
    ReadResponse,
}

impl MessageOp {
    pub const ALL: [MessageOp; 4] = [
        MessageOp::Send,
        MessageOp::RdmaWrite,
        MessageOp::ReadRequest,
        MessageOp::ReadResponse,
    ];

    /// Its name in soft-rdmad's metrics (the `op` label).
    pub fn name(self) -> &'static str {
        match self {
            MessageOp::Send => "send",
            MessageOp::RdmaWrite => "write",
            MessageOp::ReadRequest => "read_request",
            MessageOp::ReadResponse => "read_response",
        }
    }
}

/// Whole messages and payload bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Traffic {
    pub messages: u64,
    pub bytes: u64,
}

/// Messages and payload bytes by [`MessageOp`] (the arrays' index) and direction.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpTraffic {
    pub sent: [Traffic; 4],
    pub received: [Traffic; 4],
}

impl OpTraffic {
    pub fn sent(&self, op: MessageOp) -> Traffic {
        self.sent[op as usize]
    }

    pub fn received(&self, op: MessageOp) -> Traffic {
        self.received[op as usize]
    }

    /// Adds `other`'s counts (saturating).
    pub fn add(&mut self, other: &OpTraffic) {
        self.combine(other, u64::saturating_add);
    }

    /// What `self` counted beyond `base` (an earlier reading of the same counters), field by field; a field
    /// below its base counts nothing.
    pub fn since(&self, base: &OpTraffic) -> OpTraffic {
        let mut d = self.clone();
        d.combine(base, u64::saturating_sub);
        d
    }

    /// Each field the larger of `self`'s and `other`'s (two readings of the same counters, in either
    /// order: the later one).
    pub fn max(&self, other: &OpTraffic) -> OpTraffic {
        let mut m = self.clone();
        m.combine(other, u64::max);
        m
    }

    fn combine(&mut self, other: &OpTraffic, f: fn(u64, u64) -> u64) {
        let pairs = self.sent.iter_mut().zip(&other.sent);
        for (a, b) in pairs.chain(self.received.iter_mut().zip(&other.received)) {
            a.messages = f(a.messages, b.messages);
            a.bytes = f(a.bytes, b.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_and_deltas_never_go_below_zero() {
        let mut a = OpTraffic::default();
        a.sent[MessageOp::RdmaWrite as usize] = Traffic {
            messages: 2,
            bytes: 100,
        };
        let mut b = a.clone();
        b.sent[MessageOp::RdmaWrite as usize].bytes = 250;
        b.received[MessageOp::ReadResponse as usize].messages = 1;
        let d = b.since(&a);
        assert_eq!(d.sent(MessageOp::RdmaWrite), Traffic { messages: 0, bytes: 150 });
        assert_eq!(d.received(MessageOp::ReadResponse).messages, 1);
        assert_eq!(a.since(&b), OpTraffic::default(), "an older reading counts nothing");
        a.add(&d);
        assert_eq!(a.sent(MessageOp::RdmaWrite).bytes, 250);
        assert!(MessageOp::ALL.iter().enumerate().all(|(i, op)| *op as usize == i));
    }
}
