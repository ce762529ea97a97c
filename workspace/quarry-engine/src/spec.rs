//! One way to build an engine: a [`ModelSpec`] (the model file, the device, the runtime options)
//! loads the model and its tokenizer once ([`ModelSpec::load`]), [`Loaded::batch_sizes`] sizes the
//! KV pool and the pass for its device, and [`Loaded::engine`] starts an engine over them.
//! `quarry extract`, `worker`, `generate` and `bench` all start here.

use std::path::PathBuf;
use std::sync::Arc;

use quarry_model::{parse_device, KvPool, Llama, ModelError, ModelOptions};
use quarry_tokenizer::{Tokenizer, TokenizerError};

use crate::{Engine, EngineConfig, EngineError};

/// A model to run: a job's `[model]` table, or a command's `--model`, `--device` and `--runtime`.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The GGUF file, or a Hugging Face checkpoint folder.
    pub path: PathBuf,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// How it runs ([`quarry_model::ModelOptions`], fixed for the model's life).
    pub options: ModelOptions,
}

/// A model and its tokenizer, loaded once and shared by every engine started over them.
#[derive(Clone)]
pub struct Loaded {
    pub model: Arc<Llama>,
    pub tokenizer: Arc<Tokenizer>,
}

/// Why a [`ModelSpec`] did not load, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The device, or the model's weights.
    #[error("{path}: {source}")]
    Model {
        path: String,
        #[source]
        source: ModelError,
    },
    #[error("{path}: {source}")]
    Tokenizer {
        path: String,
        #[source]
        source: TokenizerError,
    },
}

impl ModelSpec {
    /// Parses the device, then reads the tokenizer (a quick check that the file is a model) and
    /// the weights onto the device.
    pub fn load(&self) -> Result<Loaded, LoadError> {
        let path = self.path.display().to_string();
        let model_err = |source| LoadError::Model {
            path: path.clone(),
            source,
        };
        let device = parse_device(&self.device).map_err(model_err)?;
        let tokenizer =
            Tokenizer::from_model(&self.path).map_err(|source| LoadError::Tokenizer {
                path: path.clone(),
                source,
            })?;
        let model = Llama::load_with(&self.path, &device, &self.options).map_err(model_err)?;
        Ok(Loaded {
            model: Arc::new(model),
            tokenizer: Arc::new(tokenizer),
        })
    }
}

impl Loaded {
    /// An engine over this model with `config`.
    pub fn engine(&self, config: EngineConfig) -> Result<Engine, EngineError> {
        Engine::new(self.model.clone(), self.tokenizer.clone(), config)
    }

    /// The KV pool and pass size for `max_running` sequences on this model's device, `kv_tokens`
    /// and `step_tokens` where the caller sets them ([`BatchSizes::for_device`]); on a GPU, read
    /// from its free memory now.
    pub fn batch_sizes(
        &self,
        max_running: usize,
        kv_tokens: Option<usize>,
        step_tokens: Option<usize>,
    ) -> Result<BatchSizes, SizeError> {
        let m = &self.model;
        let dtype = quarry_model::kv_dtype(m.device(), m.options().kv_dtype);
        let capacity = KvPool::gpu_capacity(m.config(), m.device(), dtype, crate::KV_PAGE_SIZE)?;
        BatchSizes::for_device(max_running, kv_tokens, step_tokens, capacity)
    }
}

/// An engine's KV pool and pass size for a batch on a device: a job's `batching.kv_tokens` and
/// `batching.step_tokens`, or their defaults for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSizes {
    /// Positions of keys and values the pool holds ([`EngineConfig::kv_tokens`]).
    pub kv_tokens: usize,
    /// Tokens a forward pass computes at most ([`EngineConfig::step_tokens`]).
    pub step_tokens: usize,
    /// On a GPU, the positions its free memory held.
    pub gpu_capacity: Option<usize>,
    pub max_running: usize,
}

/// Why a batch's sizes cannot be used on the device.
#[derive(Debug, thiserror::Error)]
pub enum SizeError {
    #[error(
        "kv_tokens {asked} is over the {room} positions of keys and values the GPU's free memory \
         holds once the model is loaded; leave it out to take them all"
    )]
    OverCapacity { asked: usize, room: usize },
    #[error("the GPU's free memory holds no keys and values once the model is loaded")]
    NoRoom,
    #[error("step_tokens {step_tokens} is below max_running {max_running}: every running sequence computes a token each step")]
    StepBelowBatch {
        step_tokens: usize,
        max_running: usize,
    },
    /// The device's memory could not be read.
    #[error(transparent)]
    Device(#[from] ModelError),
}

/// Positions of keys and values of a CPU engine's pool, unless set (the engine's default).
const CPU_KV_TOKENS: usize = 16_384;
/// A pass's tokens at least: 512 on a CPU; 4,096 on a GPU, whose pass costs about the same
/// whether it computes a few hundred tokens or a few thousand (it reads the weights once either
/// way), and whose batch needs the room for the prompts of the documents that replace finished
/// ones (at 512 running and 160 output tokens, about 3 a step, each a few hundred tokens the
/// cache does not hold), or it runs short of them.
const CPU_STEP_TOKENS: usize = 512;
const GPU_STEP_TOKENS: usize = 4096;

impl BatchSizes {
    /// The sizes on a device whose free memory holds `gpu_capacity` positions (`None`: a CPU):
    /// by default the whole capacity on a GPU and 16,384 positions on a CPU; passes of 4,096
    /// tokens or twice `max_running` on a GPU, 512 or `max_running` on a CPU. A `kv_tokens` over
    /// a GPU's capacity is refused here, before the pool is asked for.
    pub fn for_device(
        max_running: usize,
        kv_tokens: Option<usize>,
        step_tokens: Option<usize>,
        gpu_capacity: Option<usize>,
    ) -> Result<Self, SizeError> {
        let kv_tokens = match (kv_tokens, gpu_capacity) {
            (Some(asked), Some(room)) if asked > room => {
                return Err(SizeError::OverCapacity { asked, room })
            }
            (Some(asked), _) => asked,
            (None, Some(0)) => return Err(SizeError::NoRoom),
            (None, Some(room)) => room,
            (None, None) => CPU_KV_TOKENS,
        };
        let step_tokens = step_tokens.unwrap_or(match gpu_capacity {
            Some(_) => GPU_STEP_TOKENS.max(2 * max_running),
            None => CPU_STEP_TOKENS.max(max_running),
        });
        if step_tokens < max_running {
            return Err(SizeError::StepBelowBatch {
                step_tokens,
                max_running,
            });
        }
        Ok(Self {
            kv_tokens,
            step_tokens,
            gpu_capacity,
            max_running,
        })
    }
}

impl std::fmt::Display for BatchSizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KV pool: {} positions ({} a running sequence at {} running)",
            self.kv_tokens,
            self.kv_tokens / self.max_running.max(1),
            self.max_running
        )?;
        if let Some(room) = self.gpu_capacity {
            write!(f, ", of the {room} the GPU's free memory holds")?;
        }
        write!(f, "; passes of up to {} tokens", self.step_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU's pool takes what the GPU holds and its passes leave room for prompts; a CPU keeps
    /// the engine's sizes; a pool over the GPU's memory is refused before it is asked for.
    #[test]
    fn a_batch_fits_its_device() {
        let sizes = |max_running, kv, step, room| {
            BatchSizes::for_device(max_running, kv, step, room)
                .map(|s| (s.kv_tokens, s.step_tokens))
        };
        assert_eq!(sizes(16, None, None, None).unwrap(), (16_384, 512));
        assert_eq!(sizes(600, None, None, None).unwrap(), (16_384, 600));
        assert_eq!(
            sizes(512, None, None, Some(908_482)).unwrap(),
            (908_482, 4096)
        );
        assert_eq!(
            sizes(4096, None, None, Some(908_482)).unwrap(),
            (908_482, 8192)
        );
        let text = BatchSizes::for_device(4096, None, None, Some(908_482))
            .unwrap()
            .to_string();
        assert!(
            text.contains("908482 positions (221 a running sequence at 4096 running)")
                && text.contains("of the 908482 the GPU's free memory holds")
                && text.contains("passes of up to 8192 tokens"),
            "{text}"
        );
        // What the caller sets wins, within the GPU's memory.
        assert_eq!(
            sizes(64, Some(100_000), Some(1024), Some(908_482)).unwrap(),
            (100_000, 1024)
        );
        assert_eq!(
            sizes(64, Some(100_000), None, None).unwrap(),
            (100_000, 512)
        );
        let err = sizes(64, Some(1_000_000), None, Some(908_482)).unwrap_err();
        assert!(matches!(
            err,
            SizeError::OverCapacity {
                asked: 1_000_000,
                room: 908_482
            }
        ));
        assert!(err
            .to_string()
            .contains("kv_tokens 1000000 is over the 908482 positions"));
        assert!(matches!(
            sizes(64, None, None, Some(0)),
            Err(SizeError::NoRoom)
        ));
        assert!(matches!(
            sizes(64, None, Some(32), None),
            Err(SizeError::StepBelowBatch {
                step_tokens: 32,
                max_running: 64
            })
        ));
    }
}
