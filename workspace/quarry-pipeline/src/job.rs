//! Everything a job needs before its loop starts, built from its definition: the schema and its
//! columns, the validator, the output and rejects locations, the publisher.

use std::path::PathBuf;

use serde_json::Value;

use crate::columns::RecordShape;
use crate::config::PipelineConfig;
use crate::dataset::{DatasetJob, DatasetOptions, JobSummary};
use crate::error::PipelineError;
use crate::extract::Extractor;
use crate::extract::{read_schema, Validator};
use crate::flow::Flow;
use crate::flow::Publisher;
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::store::Location;

/// A job definition made ready: every error a bad definition can cause is raised here, before
/// any document is read.
pub struct Prepared {
    pub cfg: PipelineConfig,
    pub schema: Value,
    pub schema_sha256: String,
    pub schema_path: PathBuf,
    pub shape: RecordShape,
}

impl Prepared {
    pub fn new(cfg: PipelineConfig) -> Result<Self, PipelineError> {
        let schema_path = cfg.schema_path();
        let (schema, schema_sha256) = read_schema(&schema_path, &cfg.schema_resource_paths())?;
        let shape = RecordShape::derive(&schema).map_err(|source| PipelineError::Schema {
            path: schema_path.display().to_string(),
            source,
        })?;
        // Compile once here so a schema the validator refuses fails the job up front.
        Validator::new(&schema, &schema_path.display().to_string())?;
        Ok(Self {
            cfg,
            schema,
            schema_sha256,
            schema_path,
            shape,
        })
    }

    pub fn validator(&self) -> Result<Validator, PipelineError> {
        Validator::new(&self.schema, &self.schema_path.display().to_string())
    }

    /// The model's name in the `_model` column: its file name, or a checkpoint folder's name.
    pub fn model_name(&self) -> String {
        self.cfg
            .model_path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.cfg.model.path.display().to_string())
    }

    /// The publisher over the given output and rejects URLs (the definition's unless overridden).
    pub fn publisher(
        &self,
        output: Option<&str>,
        rejects: Option<&str>,
    ) -> Result<Publisher, PipelineError> {
        let output = match output {
            Some(u) => Location::open(u)?,
            None => Location::open(&self.cfg.resolve_url(&self.cfg.output.url))?,
        };
        let rejects = match rejects {
            Some(u) => Location::open(u)?,
            None => Location::open(&self.cfg.resolve_url(&self.cfg.rejects.url))?,
        };
        Ok(Publisher {
            shape: self.shape.clone(),
            output,
            rejects,
            pipeline: self.cfg.name.clone(),
            model: self.model_name(),
            model_runtime: serde_json::to_string(&self.cfg.model.runtime)
                .expect("options serialize"),
            schema_sha256: self.schema_sha256.clone(),
            row_group_rows: self.cfg.output.row_group_rows,
            zstd_level: self.cfg.output.zstd_level,
        })
    }

    /// Runs this dataset job to the end with `extractor`: no signal handling, metrics endpoint or
    /// progress output (tests, benchmarks, embedding). `quarry extract` wires those in itself.
    pub fn run_dataset_plain<E: Extractor>(
        &self,
        extractor: E,
        input: &Location,
        publisher: &Publisher,
    ) -> Result<JobSummary, PipelineError> {
        let mut flow = Flow::new(extractor, self.validator()?);
        let metrics = Metrics::new();
        DatasetJob::new(
            &self.cfg,
            input,
            &mut flow,
            publisher,
            &metrics,
            DatasetOptions::default(),
        )?
        .run(&Shutdown::manual())
    }
}
