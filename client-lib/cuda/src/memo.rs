//! Answers gpushared gave to questions whose answer never changes (a function's occupancy, a
//! tensor map's bytes), kept so that the same question asked again is answered in the
//! program. A question costs a round trip to gpushared; programs ask some of them every step
//! (XLA encodes its TMA kernels' tensor maps before each launch).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use crate::status::Cu;

/// Distinct answers kept at most; past that all are forgotten and asked again. Questions
/// that carry device addresses (tensor maps) have no bound of their own.
const KEPT: usize = 4096;

pub struct Memo<K, V> {
    answers: Mutex<HashMap<K, V>>,
    kept: usize,
}

impl<K, V> Default for Memo<K, V> {
    fn default() -> Self {
        Memo {
            answers: Mutex::new(HashMap::new()),
            kept: KEPT,
        }
    }
}

impl<K: Hash + Eq, V: Clone> Memo<K, V> {
    /// `question`'s answer: the one kept, else `ask`'s (kept if it is not an error; failures
    /// are asked again, as a device may answer differently later).
    pub fn answer(&self, question: K, ask: impl FnOnce(&K) -> Cu<V>) -> Cu<V> {
        if let Some(v) = self.lock().get(&question) {
            return Ok(v.clone());
        }
        let v = ask(&question)?;
        let mut answers = self.lock();
        if answers.len() >= self.kept {
            answers.clear();
        }
        answers.insert(question, v.clone());
        Ok(v)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, V>> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::result;

    #[test]
    fn a_question_asked_again_is_answered_without_asking_and_failures_are_not_kept() {
        let memo: Memo<u32, u32> = Memo::default();
        let mut asked = 0;
        let mut ask = |q: &u32| {
            asked += 1;
            Ok(q * 10)
        };
        assert_eq!(memo.answer(1, &mut ask), Ok(10));
        assert_eq!(memo.answer(1, &mut ask), Ok(10));
        assert_eq!(memo.answer(2, &mut ask), Ok(20));
        assert_eq!(asked, 2);
        assert_eq!(
            memo.answer(3, |_| Err(result::UNKNOWN)),
            Err(result::UNKNOWN)
        );
        assert_eq!(memo.answer(3, |_| Ok(7)), Ok(7), "a failure is asked again");
    }

    #[test]
    fn past_its_bound_it_forgets_and_asks_again() {
        let memo: Memo<u32, u32> = Memo {
            kept: 3,
            ..Memo::default()
        };
        for q in 0..3 {
            assert_eq!(memo.answer(q, |q| Ok(*q)), Ok(q));
        }
        assert_eq!(memo.answer(3, |q| Ok(*q)), Ok(3));
        assert_eq!(
            memo.lock().len(),
            1,
            "the full memo was emptied before 3 went in"
        );
        assert_eq!(
            memo.answer(0, |_| Ok(100)),
            Ok(100),
            "0 was forgotten: asked again"
        );
    }
}
