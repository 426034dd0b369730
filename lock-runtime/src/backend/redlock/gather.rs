//! Asking every master at once, and stopping as soon as the answers so far
//! decide the outcome.
//!
//! A master that is frozen or cut off answers nothing until the response
//! timeout; waiting for it would make every operation as slow as the
//! slowest master. So the calls run side by side (polled from the caller's
//! task, no spawn: the caller may be on any executor) and a `decided`
//! predicate over the answers so far ends the wait early. The calls still
//! out are dropped then. Their commands were handed to the masters'
//! connections on the first poll, but one a connection has not written
//! yet is then never sent (redis-rs skips a command whose caller has
//! gone): a dropped vote may be left out, as if that master had not
//! answered, and takes nothing. One already written runs, and each
//! connection keeps its commands in order, so a later release on the same
//! master still comes after it.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

/// One master's call, boxed so calls of different masters fit in one list.
pub(crate) type Call<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs `calls` together; resolves when all have answered or `decided`
/// says the answers so far (`None`: not yet) are enough. Answers come back
/// in the order of `calls`.
pub(crate) async fn gather<T>(
    calls: Vec<Call<'_, T>>,
    mut decided: impl FnMut(&[Option<T>]) -> bool,
) -> Vec<Option<T>> {
    let mut calls: Vec<Option<Call<'_, T>>> = calls.into_iter().map(Some).collect();
    let mut answers: Vec<Option<T>> = calls.iter().map(|_| None).collect();
    poll_fn(move |cx| {
        for (slot, answer) in calls.iter_mut().zip(answers.iter_mut()) {
            if let Some(call) = slot {
                if let Poll::Ready(value) = call.as_mut().poll(cx) {
                    *answer = Some(value);
                    *slot = None;
                }
            }
        }
        if calls.iter().all(Option::is_none) || decided(&answers) {
            Poll::Ready(std::mem::take(&mut answers))
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_come_back_in_order_and_a_decision_stops_the_wait() {
        let calls: Vec<Call<'_, u32>> = vec![
            Box::pin(async { 1 }),
            Box::pin(std::future::pending()),
            Box::pin(async { 3 }),
        ];
        let answers = gather(calls, |a| a.iter().flatten().count() >= 2).await;
        assert_eq!(answers, [Some(1), None, Some(3)]);
        let all: Vec<Call<'_, u32>> = vec![Box::pin(async { 7 }), Box::pin(async { 8 })];
        assert_eq!(gather(all, |_| false).await, [Some(7), Some(8)]);
    }
}
