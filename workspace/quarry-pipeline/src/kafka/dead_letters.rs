//! A worker's dead letters: each reject also sent to `rejects.dead_letter_topic`, after its file
//! is published and before its range's offset is committed (on the publisher's thread,
//! [`crate::lanes`]).

use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::kafka_err;
use crate::error::PipelineError;
use crate::flow::FileReport;

/// How long a dead-letter flush may take before the publish counts as failed.
const DEAD_LETTER_FLUSH: Duration = Duration::from_secs(30);

/// Where rejects go besides the rejects file (`rejects.dead_letter_topic`).
pub(super) struct DeadLetters {
    pub producer: BaseProducer,
    pub topic: String,
}

impl DeadLetters {
    /// Sends a file's dead letters and waits until the broker has them.
    pub fn send(&self, r: &FileReport) -> Result<(), PipelineError> {
        if r.dead_letters.is_empty() {
            return Ok(());
        }
        for (key, value) in &r.dead_letters {
            let payload = value.to_string();
            let mut rec = BaseRecord::<Vec<u8>, String>::to(&self.topic).payload(&payload);
            if let Some(k) = key {
                rec = rec.key(k);
            }
            if let Err((e, _)) = self.producer.send(rec) {
                return Err(kafka_err("dead-letter send", e));
            }
        }
        self.producer
            .flush(DEAD_LETTER_FLUSH)
            .map_err(|e| kafka_err("dead-letter flush", e))
    }
}
