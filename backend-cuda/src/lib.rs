//! backend-cuda
