//! One folder per kernel, each with its generic composition.

pub mod columns;
pub mod embedding;
pub mod linear;
