//! Benchmarks and the scaling report of burn-rtp (see the project's open benchmark issue).
