//! One way to build an engine: a [`ModelSpec`] (the model file, the device, the runtime options)
//! loads the model and its tokenizer once ([`ModelSpec::load`]), and [`Loaded::engine`] starts an
//! engine over them. `quarry extract`, `worker`, `generate` and `bench` all start here.

use std::path::PathBuf;
use std::sync::Arc;

use quarry_model::{parse_device, Llama, ModelError, ModelOptions};
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
}
