//! Device selection from a user-facing name (`cpu`, `cuda:0`).

use candle_core::Device;

use crate::error::{ModelError, Result};

/// Opens the device named `cpu`, `cuda` (ordinal 0) or `cuda:N`.
///
/// CUDA needs a build with the `cuda` feature (`make build-cuda`); without it the error says so.
pub fn parse_device(name: &str) -> Result<Device> {
    let err = |message: String| ModelError::Device {
        device: name.to_owned(),
        message,
    };
    let ordinal = match name.trim() {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => n,
            _ => return Err(err("expected `cpu`, `cuda` or `cuda:N`".into())),
        },
    };
    if !cfg!(feature = "cuda") {
        return Err(err(
            "this build has no CUDA support; rebuild with `make build-cuda` (the `cuda` feature)"
                .into(),
        ));
    }
    Device::new_cuda(ordinal).map_err(|e| ModelError::DeviceOpen {
        device: name.to_owned(),
        source: Box::new(crate::error::without_backtrace(e)),
    })
}
