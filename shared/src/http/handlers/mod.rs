//! One file per group of routes: [`topics`] (admin), [`subscriptions`] (admin),
//! [`produce`], [`consume`] (and replay), [`ack`] (ack, extend, nack), [`ops`] (health,
//! metrics, fallbacks).

pub(super) mod ack;
pub(super) mod consume;
pub(super) mod ops;
pub(super) mod produce;
pub(super) mod subscriptions;
pub(super) mod topics;
