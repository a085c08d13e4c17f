//! worker-http
