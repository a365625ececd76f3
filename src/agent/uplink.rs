//! The way toward one server: packets queued on its stream, ended with it. Every sender on a
//! stream (its receive loop's replies, each tunnel's data and closes) goes through this.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::metrics::AgentMetrics;
use crate::proto::Packet;

pub struct Uplink {
    outbound: mpsc::Sender<Packet>,
    /// Cancelled when the stream ends: nothing more can be sent.
    pub cancel: CancellationToken,
    pub metrics: Arc<AgentMetrics>,
}

impl Uplink {
    pub fn new(
        outbound: mpsc::Sender<Packet>,
        cancel: CancellationToken,
        metrics: Arc<AgentMetrics>,
    ) -> Uplink {
        Uplink {
            outbound,
            cancel,
            metrics,
        }
    }

    /// Sends a packet, waiting for room; false once the stream is gone.
    pub async fn send(&self, packet: Packet) -> bool {
        self.metrics.packet("from_agent", packet.r#type);
        tokio::select! {
            biased;
            sent = self.outbound.send(packet) => sent.is_ok(),
            _ = self.cancel.cancelled() => false,
        }
    }

    /// Sends without waiting; false when the stream toward the server is full or gone.
    pub fn try_send(&self, packet: Packet) -> bool {
        self.metrics.packet("from_agent", packet.r#type);
        self.outbound.try_send(packet).is_ok()
    }
}
