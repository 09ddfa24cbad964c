//! Gradient compression as the store uses it (placeholder until the
//! compression kernels land).
#![forbid(unsafe_code)]

use crate::bail;
use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressionParams {
    pub threshold: f32,
}

impl CompressionParams {
    pub fn parse(_params: &[(Vec<u8>, Vec<u8>)]) -> Result<CompressionParams> {
        bail!("gradient compression is not supported yet by this build")
    }
}

pub fn compress_round_trip(_p: &CompressionParams, _g: &[f32], _r: &mut [f32], _out: &mut [f32]) {}
