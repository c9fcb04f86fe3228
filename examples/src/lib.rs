//! Shared pieces of the burn-rtp examples.
