//! Keys to state changes.

use ratatui::crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::state::State;

/// What the main loop must do after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Nothing,
    Redraw,
    /// The refresh interval changed: tell the collector, then redraw.
    Interval,
    Quit,
}

pub fn handle(state: &mut State, event: &Event) -> Action {
    match event {
        Event::Key(key) if key.kind != KeyEventKind::Release => on_key(state, key),
        Event::Resize(..) => Action::Redraw,
        _ => Action::Nothing,
    }
}

fn on_key(state: &mut State, key: &KeyEvent) -> Action {
    // Raw mode turns Ctrl-C into a key; it quits from anywhere.
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return Action::Quit;
    }
    if state.editing_filter {
        match key.code {
            KeyCode::Enter => state.editing_filter = false,
            KeyCode::Esc => {
                state.editing_filter = false;
                state.filter.clear();
            }
            KeyCode::Backspace => {
                state.filter.pop();
            }
            KeyCode::Char(c) => state.filter.push(c),
            _ => return Action::Nothing,
        }
        state.keep_selection_visible();
        return Action::Redraw;
    }
    if state.show_help {
        // Any key closes help; q still quits.
        state.show_help = false;
        return match key.code {
            KeyCode::Char('q') => Action::Quit,
            _ => Action::Redraw,
        };
    }
    match key.code {
        KeyCode::Char('q') => return Action::Quit,
        KeyCode::Esc if state.filter.is_empty() => return Action::Quit,
        KeyCode::Esc => {
            state.filter.clear();
            state.keep_selection_visible();
        }
        KeyCode::Up | KeyCode::Char('k') => state.move_selection(-1),
        KeyCode::Down | KeyCode::Char('j') => state.move_selection(1),
        KeyCode::PageUp => state.move_selection(-10),
        KeyCode::PageDown => state.move_selection(10),
        KeyCode::Home => state.move_selection(isize::MIN),
        KeyCode::End => state.move_selection(isize::MAX),
        KeyCode::Char('s') => state.cycle_sort(),
        KeyCode::Char('S') => state.reverse_sort(),
        KeyCode::Char('/') => state.editing_filter = true,
        KeyCode::Char('?') | KeyCode::Char('h') => state.show_help = true,
        KeyCode::Char('+') | KeyCode::Char('=') => {
            state.step_interval(true);
            return Action::Interval;
        }
        KeyCode::Char('-') | KeyCode::Char('_') => {
            state.step_interval(false);
            return Action::Interval;
        }
        _ => return Action::Nothing,
    }
    Action::Redraw
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::state::SortKey;
    use super::*;

    fn press(state: &mut State, code: KeyCode) -> Action {
        handle(state, &Event::Key(KeyEvent::new(code, KeyModifiers::NONE)))
    }

    #[test]
    fn keys_drive_the_state() {
        let mut s = State::new(String::new(), Duration::from_secs(1));
        assert_eq!(press(&mut s, KeyCode::Char('?')), Action::Redraw);
        assert!(s.show_help);
        assert_eq!(
            press(&mut s, KeyCode::Esc),
            Action::Redraw,
            "Esc closes help"
        );
        assert!(!s.show_help);
        press(&mut s, KeyCode::Char('s'));
        assert_eq!(s.sort, SortKey::Memory);
        press(&mut s, KeyCode::Char('S'));
        assert!(s.reversed);
        assert_eq!(press(&mut s, KeyCode::Char('+')), Action::Interval);
        assert_eq!(s.interval, Duration::from_secs(2));

        press(&mut s, KeyCode::Char('/'));
        for c in "q/x".chars() {
            assert_eq!(
                press(&mut s, KeyCode::Char(c)),
                Action::Redraw,
                "typed, not run"
            );
        }
        press(&mut s, KeyCode::Backspace);
        press(&mut s, KeyCode::Enter);
        assert_eq!(s.filter, "q/");
        assert!(!s.editing_filter);
        assert_eq!(
            press(&mut s, KeyCode::Esc),
            Action::Redraw,
            "Esc clears the filter"
        );
        assert_eq!(s.filter, "");
        assert_eq!(press(&mut s, KeyCode::Esc), Action::Quit);
        assert_eq!(press(&mut s, KeyCode::Char('q')), Action::Quit);
        let ctrl_c = Event::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
        s.editing_filter = true;
        assert_eq!(handle(&mut s, &ctrl_c), Action::Quit);
    }
}
