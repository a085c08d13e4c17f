//! Model specs.
